#!/usr/bin/env bash
# docs/install.md followed word for word on this machine, as root: the build host, the VPS and the GPU
# host are all this one. Every fenced block of the guide that follows a `<!-- host: ... -->` marker is
# extracted and run in the guide's order, in one bash (set -x prints each command as it runs), up to the
# runner under the `scrinalia` user claiming a run, then the upgrade section with the same release.
#
# What is not the guide's (each because this machine is not two fresh Debian hosts):
#   * the build host is a fresh `git clone` of this checkout's HEAD (commit first);
#   * the first block of each host sets its names: here PG_CLUSTER=guide, PG_PORT=$GUIDE_PG_PORT (5499;
#     the machine's own cluster 15/main on 5432 is never touched), the VPS's private address 127.0.0.2,
#     the GPU host's 127.0.0.1 (all on loopback);
#   * the cluster 15/guide is made here with pg_createcluster (on a fresh VPS, apt-get install postgresql
#     makes 15/main);
#   * `systemctl` and `journalctl` are shell functions running bench/systemctl_shim.py (PID 1 is not
#     systemd here), and `scp` copies on this machine (user@host:PATH -> PATH);
#   * no GPU: the wheelhouse takes the CPU build of torch (PIP_CONSTRAINT=constraints-cpu.txt), as the
#     guide says for a host without a GPU.
# Everything it made is removed at the end (also after a failure): the user, /opt/scrinalia, /etc/scrinalia,
# the units, the cluster, the files in /root, the db.internal line of /etc/hosts.
#
#   sudo bash bench/install_transcript.sh            (about ten minutes; the log: $WORK/transcript.log)
#   GUIDE_KEEP=1 ...     leave everything in place to look at (then: bash bench/install_transcript.sh --cleanup)
#   GUIDE_CHECKOUT=DIR   build from this existing clone instead of a fresh one (a second try, faster)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PORT=${GUIDE_PG_PORT:-5499}
WORK=$(mktemp -d /tmp/scrinalia-guide.XXXXXX)
SHIM="$REPO/bench/systemctl_shim.py"
export SHIM_STATE_DIR=/run/scrinalia-guide-shim SHIM_PG_CLUSTER="15-guide"

[ "$(id -u)" = 0 ] || { echo "run it as root" >&2; exit 2; }
cleanup() {
  set +e
  python3 "$SHIM" stop-all
  pg_dropcluster --stop 15 guide 2>/dev/null
  rm -rf /etc/postgresql/15/guide   # what the guide added there (certificate, conf.d) outlives the cluster
  userdel scrinalia 2>/dev/null
  rm -rf /opt/scrinalia /etc/scrinalia /etc/systemd/system/scrinalia-*.service /var/lib/scrinalia \
         /var/cache/scrinalia-runner /run/scrinalia-runner "$SHIM_STATE_DIR" /root/scrinalia-ca \
         /root/scrinalia-*-password /root/runner-password /root/db-ca.pem /root/wheelhouse /root/wheelhouse.tar.gz \
         /root/scrinalia_runner-*.whl /root/scrinalia-*.dump
  sed -i '/ db.internal$/d' /etc/hosts
}
if [ "${1:-}" = "--cleanup" ]; then cleanup; exit 0; fi
for taken in /opt/scrinalia /etc/scrinalia /etc/postgresql/15/guide; do
  [ ! -e "$taken" ] || { echo "$taken exists: this is not a throwaway machine, or a run did not clean up" >&2; exit 2; }
done
! id scrinalia >/dev/null 2>&1 || { echo "the user scrinalia exists" >&2; exit 2; }
# The unit's API listens on 127.0.0.1:8000: someone else's API there would answer the guide's checks.
! ss -ltn | grep -qE "[:.](8000|$PORT) " || { echo "port 8000 or $PORT is taken on this machine" >&2; exit 2; }

keep_logs() {
  cp -r "$SHIM_STATE_DIR" "$WORK/services" 2>/dev/null
  [ -n "${GUIDE_KEEP:-}" ] || cleanup
}
trap keep_logs EXIT

# The guide's blocks, in order, each headed by its host and run where that host's shell would be.
python3 - "$REPO/docs/install.md" "$PORT" > "$WORK/guide.sh" <<'PY'
import re, sys
text, port = open(sys.argv[1]).read(), sys.argv[2]
overrides = [  # the first block of each host: its names (see the header of this script)
    (r"^PG_VERSION=15 PG_CLUSTER=main PG_PORT=5432\b", f"PG_VERSION=15 PG_CLUSTER=guide PG_PORT={port}"),
    (r"^VPS_PRIVATE_IP=10\.0\.0\.1 PG_PORT=5432\b", f"VPS_PRIVATE_IP=127.0.0.2 PG_PORT={port}"),
    (r"^VPS_PRIVATE_IP=10\.0\.0\.1\b", "VPS_PRIVATE_IP=127.0.0.2"),
    (r"^GPU_HOST_IP=10\.0\.0\.20\b", "GPU_HOST_IP=127.0.0.1"),
]
blocks = re.findall(r"<!-- host: (\w+) -->\n```sh\n(.*?)```", text, re.S)
assert blocks, "no host blocks in docs/install.md"
for number, (host, body) in enumerate(blocks, 1):
    for pattern, value in overrides:
        body = re.sub(pattern, value, body, flags=re.M)
    print(f'\n: "=== block {number}: {host} host ==="')
    print('cd "$BUILD_DIR"' if host == "build" else "cd /root")
    print(body)
print(f'\n: "=== {len(blocks)} blocks of docs/install.md ran ==="')
PY

systemctl() { python3 "$SHIM" systemctl "$@"; }
journalctl() { python3 "$SHIM" journalctl "$@"; }
scp() { local last=$(( $# )); local dest=${!last}; cp "${@:1:last-1}" "${dest#*:}"; }
export -f systemctl journalctl scp

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin   # a root shell's, not a venv's
export PIP_CONSTRAINT="$REPO/constraints-cpu.txt" PIP_DISABLE_PIP_VERSION_CHECK=1
BUILD_DIR=${GUIDE_CHECKOUT:-$WORK/checkout}
[ -n "${GUIDE_CHECKOUT:-}" ] || git clone -q "$REPO" "$BUILD_DIR"
pg_createcluster 15 guide -p "$PORT" >/dev/null   # what apt-get install postgresql does on a fresh VPS
pg_ctlcluster 15 guide start

started=$(date +%s)
set +e
( set -ex; . "$WORK/guide.sh" ) 2>&1 | tee "$WORK/transcript.log"
status=${PIPESTATUS[0]}
set -e
echo "the guide took $(( $(date +%s) - started )) s; exit $status; transcript: $WORK/transcript.log," \
     "its script: $WORK/guide.sh, the services' logs: $WORK/services/"
exit "$status"
