"""The dependency direction of docs/architecture.md: runner -> scrinalia, never the other way round.

Static (every import statement in the source) so that a lazy import inside a function is caught too.
The dynamic checks (the API's and the supervisor's sys.modules) live beside the API and runner tests.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _top(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


def test_scrinalia_never_imports_runner():
    offenders = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "scrinalia").rglob("*.py")
        if "runner" in _top(_imports(path))
    }
    assert not offenders, offenders


def test_the_api_never_imports_torch_transformers_or_runner():
    forbidden = {"torch", "transformers", "runner"}
    offenders = {
        str(path.relative_to(ROOT)): sorted(_top(_imports(path)) & forbidden)
        for path in (ROOT / "scrinalia/api").rglob("*.py")
        if _top(_imports(path)) & forbidden
    }
    assert not offenders, offenders


def test_torch_is_imported_only_inside_functions_outside_the_engines():
    """A module-level `import torch` anywhere the supervisor or the API may import is a bug; engines
    and worker bodies import it lazily, inside the functions that run in a child."""
    offenders = []
    for path in [*(ROOT / "scrinalia").rglob("*.py"), *(ROOT / "runner").rglob("*.py")]:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            mods = set()
            if isinstance(node, ast.Import):
                mods = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = {node.module.split(".")[0]}
            if mods & {"torch", "transformers"}:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders
