"""Import structure of a package: its import cycles and its largest modules (lines, fan-out).

    python tools/import_report.py [PACKAGE] [--top N] [--check] [--packages]

A cycle is a group of modules that import each other, directly or not (strongly connected components of the
import graph, function-level imports included). Counted twice: over the imports that run, and with the
imports under ``TYPE_CHECKING`` too (they never run, but show which types two modules share). Fan-out: the
package's own modules a module imports directly. ``--packages``: how many modules (and lines) each package
holds, the top level counted as ``(top)``. The architecture contracts themselves are import-linter's
(``lint-imports``, pyproject.toml). Their ``exclude_type_checking_imports`` holds for every contract, so
``--check`` (tools/lint) is what keeps the module graph free of cycles with the ``TYPE_CHECKING`` imports
too: it exits 1 when either count is not 0. It also checks that every module of the package is in a layer of
the layers contract in pyproject.toml (import-linter checks only the modules its layers name: a new top-level
module would be in none, and unchecked): ``--check`` exits 1 when one is not.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import grimp


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Return the import graph's cycles (components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def layer_names(pyproject: Path, package: str) -> tuple[str, list[str]]:
    """Return the name and the layer modules (``a | b`` split) of the layers contract over ``package``."""
    config = tomllib.loads(pyproject.read_text()).get("tool", {}).get("importlinter", {})
    for contract in config.get("contracts", []):
        if contract.get("type") == "layers":
            names = [n.strip() for layer in contract["layers"] for n in layer.split("|")]
            if all(n == package or n.startswith(package + ".") for n in names):
                return str(contract.get("name", "")), names
    return "", []


def outside_layers(modules: set[str], package: str, layers: list[str]) -> list[str]:
    """Return the modules of ``package`` (the root itself aside) that are in no layer, sorted."""
    return sorted(
        m for m in modules if m != package and not any(m == n or m.startswith(n + ".") for n in layers)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="launcher")
    parser.add_argument("--top", type=int, default=8, help="how many of the largest modules to list")
    parser.add_argument("--check", action="store_true", help="exit 1 when there is any import cycle")
    parser.add_argument("--packages", action="store_true", help="list the modules and lines per package")
    args = parser.parse_args()
    total = 0
    for type_checking in (False, True):
        graph = grimp.build_graph(
            args.package, exclude_type_checking_imports=not type_checking, cache_dir=None
        )
        found = cycles(graph)
        total += len(found)
        what = "with TYPE_CHECKING imports" if type_checking else "imports that run"
        print(f"{args.package}: {len(graph.modules)} modules, {len(found)} import cycles ({what})")
        for group in found:
            print("  " + " <-> ".join(group))
    graph = grimp.build_graph(args.package, exclude_type_checking_imports=True, cache_dir=None)
    root = Path(__import__(args.package).__file__ or ".").parent
    rows = []
    for module in graph.modules:
        rel = module.split(".")[1:]
        path = (
            root.joinpath(*rel, "__init__.py")
            if (root.joinpath(*rel)).is_dir()
            else root.joinpath(*rel[:-1], rel[-1] + ".py")
            if rel
            else root / "__init__.py"
        )
        lines = len(path.read_text().splitlines()) if path.is_file() else 0
        rows.append((lines, len(graph.find_modules_directly_imported_by(module)), module))
    print("largest modules (lines, fan-out):")
    for lines, fan_out, module in sorted(rows, reverse=True)[: args.top]:
        print(f"  {lines:5d} {fan_out:3d}  {module}")
    if args.packages:
        per: dict[str, list[int]] = {}
        for lines, _, module in rows:
            parts = module.split(".")
            is_package = root.joinpath(*parts[1:]).is_dir() if len(parts) > 1 else True
            if is_package and len(parts) <= 2:
                continue  # a package's __init__ is counted with the package's modules below
            name = ".".join(parts[:2]) if len(parts) > 2 else f"{parts[0]} (top)"
            count = per.setdefault(name, [0, 0])
            count[0] += 1
            count[1] += lines
        print("modules per package (modules, lines):")
        for name, (count, lines) in sorted(per.items()):
            print(f"  {count:4d} {lines:6d}  {name}")
    name, layers = layer_names(Path(__file__).resolve().parents[1] / "pyproject.toml", args.package)
    missing = outside_layers(set(graph.modules), args.package, layers)
    if not layers:
        print(f"layers: pyproject.toml has no layers contract over {args.package}: not checked")
    elif missing:
        print(f"layers: {len(missing)} modules in no layer of {name!r}: {', '.join(missing)}")
    else:
        print(f"layers: every one of the {len(graph.modules) - 1} modules is in a layer of {name!r}")
    return 1 if args.check and (total or missing or not layers) else 0


if __name__ == "__main__":
    raise SystemExit(main())
