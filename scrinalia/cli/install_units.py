"""``scrinalia install-units``: write the systemd units and the env-file templates of this installation.

The wheel carries the templates (the repository's ``systemd/`` folder, installed as ``scrinalia._systemd``);
this command fills in the real paths (the virtualenv's bin, the env files' directory) and the service
user, so installing from a wheel needs no checkout (docs/install.md, decision 0151). Units are rewritten on
every call (re-run it after an upgrade; local changes belong in ``systemctl edit`` drop-ins); an env file
that exists is never touched, because it holds the operator's passwords.
"""
from __future__ import annotations

import grp
import os
import pwd
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from scrinalia import __version__
from scrinalia.bundled import systemd_dir

# Each unit and the env file it reads (both named in the template: EnvironmentFile=@CONFDIR@/<env file>).
UNITS = {"api": "scrinalia.env", "scheduler": "scrinalia.env", "runner": "runner.env"}
PLACEHOLDER = re.compile(r"@[A-Z]+@")
CONFIG_DIR_MODE = 0o750
ENV_FILE_MODE = 0o640
UNIT_FILE_MODE = 0o644


class InstallUnitsError(click.ClickException):
    """A user or group that does not exist, a virtualenv without the commands: nothing is written."""


@dataclass(frozen=True, slots=True)
class Installation:
    """What the templates are filled with: paths as the service sees them (not under ``root``)."""

    bindir: Path
    config_dir: Path
    user: str
    group: str

    def fill(self, template: str) -> str:
        values = {"@BINDIR@": str(self.bindir), "@CONFDIR@": str(self.config_dir),
                  "@USER@": self.user, "@GROUP@": self.group}
        text = PLACEHOLDER.sub(lambda m: values.get(m.group(0), m.group(0)), template)
        left = sorted(set(PLACEHOLDER.findall(text)))
        if left:
            raise InstallUnitsError(f"the templates name unknown placeholders: {', '.join(left)}")
        return text


def unit_file_name(unit: str) -> str:
    return f"scrinalia-{unit}.service"


def render_unit(unit: str, installation: Installation) -> str:
    template = (systemd_dir() / unit_file_name(unit)).read_text()
    return (f"# Written by `scrinalia install-units` (scrinalia-runner {__version__}); re-run it after an upgrade,\n"
            f"# change it with `systemctl edit {unit_file_name(unit)}` (a drop-in survives the rewrite).\n"
            + installation.fill(template))


def render_env_file(name: str, installation: Installation) -> str:
    return installation.fill((systemd_dir() / name).read_text())


def _check_identity(user: str, group: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise InstallUnitsError(
            f"user {user!r} does not exist; create it first (docs/install.md): "
            f"useradd --system --user-group --home-dir /var/lib/{user} --shell /usr/sbin/nologin {user}"
        ) from None
    try:
        grp.getgrnam(group)
    except KeyError:
        raise InstallUnitsError(f"group {group!r} does not exist (useradd --user-group makes one per user)") from None


def _check_commands(bindir: Path, units: tuple[str, ...]) -> None:
    needed = {"scrinalia-runner" if unit == "runner" else "scrinalia" for unit in units}
    for command in sorted(needed):
        if not os.access(bindir / command, os.X_OK):
            raise InstallUnitsError(f"{bindir / command} is not an executable: pass the virtualenv the wheel is "
                                    "installed in with --venv")


def _under(root: Path, path: Path) -> Path:
    return root / path.relative_to(path.anchor) if path.is_absolute() else root / path


def _owned_by_root_and(path: Path, group: str) -> None:
    """root:GROUP, where this command may set it (run as root); else left to the caller's identity."""
    if os.geteuid() == 0:
        os.chown(path, 0, grp.getgrnam(group).gr_gid)


def install(units: tuple[str, ...], installation: Installation, unit_dir: Path, root: Path) -> list[str]:
    """Write the units and any missing env file under ``root``; return what was done, one line each."""
    done: list[str] = []
    config_dir = _under(root, installation.config_dir)
    if not config_dir.is_dir():
        config_dir.mkdir(parents=True, mode=CONFIG_DIR_MODE)
        config_dir.chmod(CONFIG_DIR_MODE)
        _owned_by_root_and(config_dir, installation.group)
        done.append(f"created {config_dir} (0750 root:{installation.group})")
    for name in sorted({UNITS[unit] for unit in units}):
        target = config_dir / name
        if target.exists():
            done.append(f"kept {target} (it exists; the template is {systemd_dir() / name})")
            continue
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ENV_FILE_MODE)
        with os.fdopen(descriptor, "w") as out:
            out.write(render_env_file(name, installation))
        target.chmod(ENV_FILE_MODE)
        _owned_by_root_and(target, installation.group)
        done.append(f"wrote {target} (0640 root:{installation.group}): edit its CHANGE-ME values")
    units_dir = _under(root, unit_dir)
    units_dir.mkdir(parents=True, exist_ok=True)
    for unit in units:
        target = units_dir / unit_file_name(unit)
        target.write_text(render_unit(unit, installation))
        target.chmod(UNIT_FILE_MODE)
        done.append(f"wrote {target}")
    return done


@click.command("install-units")
@click.argument("units", nargs=-1, required=True, type=click.Choice(sorted(UNITS)))
@click.option("--venv", type=click.Path(path_type=Path, file_okay=False), default=Path(sys.prefix),
              show_default="this command's virtualenv",
              help="The virtualenv the wheel is installed in (ExecStart= runs its bin/).")
@click.option("--config-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("/etc/scrinalia"),
              show_default=True, help="Where the env files live (EnvironmentFile=).")
@click.option("--user", default="scrinalia", show_default=True, help="The system user the services run as.")
@click.option("--group", default=None, help="Its group (default: the user's name).")
@click.option("--unit-dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("/etc/systemd/system"), show_default=True, help="Where systemd reads the units.")
@click.option("--root", type=click.Path(path_type=Path, file_okay=False), default=Path("/"), show_default=True,
              help="Write every file under this directory instead (an image being built, a test); the paths "
                   "inside the files stay as given.")
def command(units: tuple[str, ...], venv: Path, config_dir: Path, user: str, group: str | None, unit_dir: Path,
            root: Path) -> None:
    """Write the systemd units UNITS (api, scheduler: the VPS; runner: the GPU host) filled in for this
    installation, and their env files where none exists yet (0640 root:GROUP, in a 0750 directory)."""
    group = group or user
    _check_identity(user, group)
    bindir = venv.absolute() / "bin"
    _check_commands(bindir, units)
    installation = Installation(bindir=bindir, config_dir=config_dir.absolute(), user=user, group=group)
    for line in install(tuple(dict.fromkeys(units)), installation, unit_dir, root):
        click.echo(line)
    names = " ".join(unit_file_name(unit) for unit in dict.fromkeys(units))
    click.echo(f"next: systemctl daemon-reload && systemctl enable --now {names}")
