"""The figures of issue 27 for the runner's house, measured by static tools only (radon, grimp, ast).

    python bench/code_figures.py [--root PATH] [--json]

* the share of blocks (functions, methods, classes) at cyclomatic complexity C (11+) or worse, over the
  production code (``scrinalia/`` and ``runner/``, without the scale model ``runner/simulation/`` and
  ``runner/memory_ledger``) and over the scale model alone;
* the import cycles among ``runner``'s production modules (every import, lazy and ``TYPE_CHECKING`` ones
  included: a cycle there is still a knot in the design);
* ``Supervisor``'s attributes (names assigned on ``self`` anywhere in its class) and the largest number of
  parameters any production constructor takes (its collaborators);
* names of classes defined twice in production with different meanings (one name, two concepts).

``--root`` measures another checkout (a ``git worktree`` of an older commit gives the "before")."""
from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

from radon.complexity import cc_visit

SCALE_MODEL = ("runner/simulation/", "runner/memory_ledger")  # the module, or the package it became


def python_files(root: Path) -> list[Path]:
    return sorted(p for top in ("scrinalia", "runner") for p in (root / top).rglob("*.py")
                  if "__pycache__" not in p.parts)


def is_scale_model(root: Path, path: Path) -> bool:
    rel = path.relative_to(root).as_posix()
    return any(rel.startswith(prefix) for prefix in SCALE_MODEL)


def complexity(root: Path, files: list[Path]) -> dict[str, object]:
    """Blocks of rank C or worse (cyclomatic > 10), as radon ranks them, over every block radon sees."""
    blocks = worse = 0
    names: list[str] = []
    for path in files:
        for block in cc_visit(path.read_text()):
            for item in [block, *getattr(block, "closures", [])]:
                blocks += 1
                if item.complexity > 10:
                    worse += 1
                    names.append(f"{path.relative_to(root)}:{item.name} ({item.complexity})")
    return {"blocks": blocks, "c_or_worse": worse, "share_percent": round(100 * worse / max(blocks, 1), 2),
            "worst": sorted(names, key=lambda n: -int(n.rsplit("(", 1)[1][:-1]))[:10]}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, module: str) -> set[str]:
    """Every module an import statement names, wherever it stands (lazy, ``TYPE_CHECKING``)."""
    names: set[str] = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def cycles(root: Path) -> list[list[str]]:
    """Strongly connected components (more than one module) of ``runner``'s production import graph."""
    files = {module_name(root, p): p for p in (root / "runner").rglob("*.py")
             if "__pycache__" not in p.parts and not is_scale_model(root, p)}
    edges = {m: sorted(n for n in imported(ast.parse(p.read_text()), m) if n in files and n != m)
             for m, p in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for module in sorted(files):
        if module not in index:
            visit(module)
    return sorted(found)


def classes(root: Path, files: list[Path]) -> list[tuple[Path, ast.ClassDef]]:
    return [(path, node) for path in files for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)]


def self_attributes(cls: ast.ClassDef) -> set[str]:
    return {t.attr for node in ast.walk(cls) for t in getattr(node, "targets", [getattr(node, "target", None)])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def constructor_parameters(cls: ast.ClassDef) -> int:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args
            return len(args.posonlyargs) + len(args.args) - 1 + len(args.kwonlyargs)
    return 0


def figures(root: Path) -> dict[str, object]:
    every = python_files(root)
    production = [p for p in every if not is_scale_model(root, p)]
    model = [p for p in every if is_scale_model(root, p)]
    found = classes(root, production)
    supervisor = next(node for path, node in found if node.name == "Supervisor")
    widest = max(found, key=lambda pc: constructor_parameters(pc[1]))
    by_name: dict[str, list[str]] = defaultdict(list)
    for path, node in found:
        by_name[node.name].append(str(path.relative_to(root)))
    return {
        "complexity_production": complexity(root, production),
        "complexity_scale_model": complexity(root, model),
        "runner_import_cycles": cycles(root),
        "supervisor_attributes": len(self_attributes(supervisor)),
        "supervisor_constructor_parameters": constructor_parameters(supervisor),
        "widest_constructor": {"class": f"{widest[0].relative_to(root)}:{widest[1].name}",
                               "parameters": constructor_parameters(widest[1])},
        "constructors_over_8": sorted(f"{p.relative_to(root)}:{c.name} ({constructor_parameters(c)})"
                                      for p, c in found if constructor_parameters(c) > 8),
        "class_names_defined_twice": {n: paths for n, paths in sorted(by_name.items()) if len(paths) > 1},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = figures(args.root.resolve())
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key}: {json.dumps(value, indent=2) if isinstance(value, dict | list) else value}")


if __name__ == "__main__":
    main()
