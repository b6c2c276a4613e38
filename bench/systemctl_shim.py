"""``systemctl`` and ``journalctl`` for bench/install_transcript.sh on a machine whose PID 1 is not systemd.

The guide (docs/install.md) is followed word for word; only these two commands are answered by this file,
which starts each unit as systemd would from the unit file that ``scrinalia install-units`` wrote: its
``User=``/``Group=`` (and their supplementary groups), ``EnvironmentFile=`` then ``Environment=``,
``ExecStart=`` (continuation lines, ``%H``), ``RuntimeDirectory=``/``CacheDirectory=`` (made, owned by the
user, their paths in ``$RUNTIME_DIRECTORY``/``$CACHE_DIRECTORY``), ``Type=notify`` (``enable --now``
returns once the service sent READY=1 on ``$NOTIFY_SOCKET``), and on stop ``KillSignal=`` then SIGKILL of
the process group after ``TimeoutStopSec=``. The sandboxing lines (``ProtectSystem=`` ...) are not
emulated. ``postgresql@V-NAME`` maps to ``pg_ctlcluster V NAME``; the machine's other clusters are refused.
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

UNIT_DIR = Path("/etc/systemd/system")
STATE = Path(os.environ.get("SHIM_STATE_DIR", "/run/scrinalia-guide-shim"))
ALLOWED_CLUSTER = os.environ.get("SHIM_PG_CLUSTER", "")  # e.g. "15-guide": the only cluster it may touch


def unit_name(name: str) -> str:
    return name if name.endswith(".service") else f"{name}.service"


def parse_unit(path: Path) -> dict[str, list[str]]:
    """[Service] keys -> values in order (a key may repeat), continuation lines joined."""
    lines: list[str] = []
    for raw in path.read_text().splitlines():
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + raw.strip()
        else:
            lines.append(raw.strip())
    section = ""
    values: dict[str, list[str]] = {}
    for line in lines:
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]" and "=" in line:
            key, value = line.split("=", 1)
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def read_env_file(path: str) -> dict[str, str]:
    optional = path.startswith("-")
    file = Path(path.lstrip("-"))
    if not file.exists():
        if optional:
            return {}
        raise SystemExit(f"EnvironmentFile {file} does not exist")
    env = {}
    for line in file.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip().strip('"')
    return env


def service_env(service: dict[str, list[str]], user: pwd.struct_passwd) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, "SHELL": user.pw_shell}
    for path in service.get("EnvironmentFile", []):
        env.update(read_env_file(path))
    for assignments in service.get("Environment", []):
        for item in assignments.split():
            key, value = item.split("=", 1)
            env[key] = value
    return env


def make_dirs(service: dict[str, list[str]], key: str, base: str, mode: int, user: pwd.struct_passwd,
              gid: int) -> str | None:
    names = " ".join(service.get(key, [])).split()
    for name in names:
        directory = Path(base) / name
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(mode)
        os.chown(directory, user.pw_uid, gid)
    return ":".join(str(Path(base) / n) for n in names) or None


def start(name: str) -> None:
    unit = unit_name(name)
    if is_active(unit):
        return
    service = parse_unit(UNIT_DIR / unit)
    user = pwd.getpwnam(service.get("User", ["root"])[0])
    group = grp.getgrnam(service.get("Group", [user.pw_name])[0])
    env = service_env(service, user)
    runtime = make_dirs(service, "RuntimeDirectory", "/run",
                        int(service.get("RuntimeDirectoryMode", ["0755"])[0], 8), user, group.gr_gid)
    if runtime:
        env["RUNTIME_DIRECTORY"] = runtime
    cache = make_dirs(service, "CacheDirectory", "/var/cache", 0o755, user, group.gr_gid)
    if cache:
        env["CACHE_DIRECTORY"] = cache
    argv = service["ExecStart"][-1].replace("%H", socket.gethostname()).split()
    STATE.mkdir(parents=True, exist_ok=True)
    notify = None
    if service.get("Type", ["simple"])[0] == "notify":
        notify_path = STATE / f"{unit}.notify"
        notify_path.unlink(missing_ok=True)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(notify_path))
        os.chown(notify_path, user.pw_uid, group.gr_gid)
        env["NOTIFY_SOCKET"] = str(notify_path)
    log = open(STATE / f"{unit}.log", "ab")
    proc = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            user=user.pw_uid, group=group.gr_gid,
                            extra_groups=[g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem],
                            start_new_session=True)
    (STATE / f"{unit}.json").write_text(json.dumps({"pid": proc.pid, "started": time.time()}))
    if notify is not None:
        wait_ready(unit, proc, notify, timeout=float(service.get("TimeoutStartSec", ["300"])[0]))


def wait_ready(unit: str, proc: subprocess.Popen, notify: socket.socket, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    notify.settimeout(1.0)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{unit}: exited with {proc.returncode} before READY=1 (journalctl -u {unit})")
        try:
            message = notify.recv(4096).decode()
        except TimeoutError:
            continue
        if "READY=1" in message.split("\n"):
            return
    raise SystemExit(f"{unit}: no READY=1 within {timeout:g} s")


def pid_of(unit: str) -> int | None:
    state = STATE / f"{unit}.json"
    if not state.exists():
        return None
    pid = json.loads(state.read_text())["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    # A zombie of ours would still answer kill(0): read its state.
    status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return None if status == "Z" else pid


def is_active(unit: str) -> bool:
    return pid_of(unit) is not None


def stop(name: str) -> None:
    unit = unit_name(name)
    pid = pid_of(unit)
    if pid is None:
        return
    service = parse_unit(UNIT_DIR / unit)
    sig = getattr(signal, service.get("KillSignal", ["SIGTERM"])[0])
    os.kill(pid, sig)  # KillMode=mixed: the main process only, then the whole group after the timeout
    deadline = time.monotonic() + float(service.get("TimeoutStopSec", ["90"])[0])
    while time.monotonic() < deadline and pid_of(unit) is not None:
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def postgres(action: str, unit: str) -> int:
    match = re.fullmatch(r"postgresql@(\d+)-(.+)\.service", unit)
    if not match or f"{match.group(1)}-{match.group(2)}" != ALLOWED_CLUSTER:
        print(f"systemctl shim: refusing {action} {unit} (only postgresql@{ALLOWED_CLUSTER})", file=sys.stderr)
        return 1
    return subprocess.run(["pg_ctlcluster", match.group(1), match.group(2), action]).returncode


def systemctl(args: list[str]) -> int:
    words = [a for a in args if not a.startswith("-")]
    flags = {a for a in args if a.startswith("-")}
    verb, units = words[0], [unit_name(u) for u in words[1:]]
    if verb == "daemon-reload":
        return 0
    if any(u.startswith("postgresql") for u in units):
        return max(postgres(verb, u) for u in units)
    if verb == "enable":
        for unit in units:
            if not (UNIT_DIR / unit).exists():
                print(f"Failed to enable unit: Unit file {unit} does not exist.", file=sys.stderr)
                return 1
            print(f"Created symlink /etc/systemd/system/multi-user.target.wants/{unit} -> {UNIT_DIR / unit}.")
            if "--now" in flags:
                start(unit)
        return 0
    if verb == "start":
        for unit in units:
            start(unit)
        return 0
    if verb == "stop":
        for unit in units:
            stop(unit)
        return 0
    if verb == "restart":
        for unit in units:
            stop(unit)
            start(unit)
        return 0
    if verb == "is-active":
        states = ["active" if is_active(u) else "inactive" for u in units]
        print("\n".join(states))
        return 0 if all(s == "active" for s in states) else 3
    if verb == "status":
        code = 0
        for unit in units:
            pid = pid_of(unit)
            print(f"* {unit}\n     Active: {'active (running)' if pid else 'inactive (dead)'}"
                  + (f"\n   Main PID: {pid}" if pid else ""))
            code = code or (0 if pid else 3)
        return code
    print(f"systemctl shim: {verb} is not emulated", file=sys.stderr)
    return 1


def journalctl(args: list[str]) -> int:
    unit = unit_name(args[args.index("-u") + 1])
    lines = int(args[args.index("-n") + 1]) if "-n" in args else 10
    log = STATE / f"{unit}.log"
    if log.exists():
        print("\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
    return 0


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "systemctl":
        return systemctl(args)
    if command == "journalctl":
        return journalctl(args)
    if command == "stop-all":
        for state in sorted(STATE.glob("*.json")):
            stop(state.name[: -len(".json")])
        return 0
    raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    sys.exit(main())
