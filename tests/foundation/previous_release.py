"""The previous release of Scrinalia, built once and cached outside the repository, for the tests that run it
against this checkout's schema (expand/contract, decision 0125).

``PREVIOUS_RELEASE`` is the one place that names it: the commit (later the last release's tag) whose code
must keep working on the head schema until the release after it. Its tree is exported with ``git archive``
(a plain copy: no worktree entry in the repository, so a cache made from one clone stays valid for the
next) into ``$XDG_CACHE_HOME/scrinalia/compat/<commit>/src`` with its own virtual environment beside it
(``venv``, made by uv: the package with its API and runner extras, torch held to the CPU build by that
tree's ``constraints-cpu.txt``). Built once per machine, under a file lock (two test sessions at once build it once); a
``complete`` marker written last tells a finished build from one killed half-way, which is redone.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

#: The previous release (later: the last release's tag): its code must work on the head schema until the
#: release after this one. The one place that names it.
PREVIOUS_RELEASE = "9bcb126379319bfbc64b97f5c14a45ed3d96cf1c"

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class PreviousRelease:
    commit: str
    src: Path    # the release's tree (its tests' workers are importable from here)
    venv: Path
    build_seconds: float  # 0 when the cache already held it

    @property
    def schema_head(self) -> str:
        """The head of its own migrations (what its version check requires), read off its tree."""
        from alembic.script import ScriptDirectory

        heads = ScriptDirectory(str(self.src / "migrations")).get_heads()
        assert len(heads) == 1, heads
        return heads[0]

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def env(self, database_url: str, **extra: str) -> dict[str, str]:
        """An environment for the release's processes: its own interpreter's packages, its tree first."""
        keep = {k: v for k, v in os.environ.items()
                if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")}
        return {**keep, "DATABASE_URL": database_url, "PYTHONPATH": str(self.src), "PYTHONUNBUFFERED": "1",
                "SCRINALIA_WORKER_PLUGINS": "tests.runner.workers:ALL", **extra}


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "scrinalia" / "compat"


def _run(argv: list[str], cwd: Path | None = None, timeout: float = 1800) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _export_tree(commit: str, into: Path) -> None:
    archive = into.parent / "tree.tar"
    _run(["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), commit])
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()


def _build(commit: str, into: Path) -> None:
    """Built in place; the ``complete`` marker comes last, so a build killed half-way is redone whole."""
    src, venv = into / "src", into / "venv"
    src.mkdir(parents=True)
    _export_tree(commit, src)
    # uv, as the wheel tests install (decisions 0152, 0300): pip took 5-7 minutes here for torch and the
    # release's packages on a machine with a cold cache, uv takes well under one (decision 0360).
    uv = [sys.executable, "-m", "uv"]
    _run([*uv, "venv", "-q", "--python", sys._base_executable, str(venv)])  # type: ignore[attr-defined]  # CPython's own
    _run([*uv, "pip", "install", "-q", "--system-certs", "--python", str(venv / "bin" / "python"),
          "-c", str(src / "constraints-cpu.txt"), *_find_links(), f"{src}[api,runner]"])
    (into / "complete").write_text(commit + "\n")


def _find_links() -> list[str]:
    """pip's extra wheel directories on this host (``PIP_FIND_LINKS`` or pip's configuration) as uv's flags:
    the CPU build of torch that constraints-cpu.txt pins lies there; uv does not read pip's configuration."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if not links:
        asked = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                               capture_output=True, text=True, timeout=60)
        links = asked.stdout.split() if asked.returncode == 0 else []
    return [flag for link in links for flag in ("--find-links", link)]


def previous_release(commit: str = PREVIOUS_RELEASE) -> PreviousRelease:
    """The release, built when the cache does not hold it yet (minutes, once per machine)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / commit
    started = time.monotonic()
    built = False
    with open(root / f"{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "complete").is_file():
            shutil.rmtree(final, ignore_errors=True)
            _build(commit, final)
            built = True
    return PreviousRelease(commit, final / "src", final / "venv", time.monotonic() - started if built else 0.0)
