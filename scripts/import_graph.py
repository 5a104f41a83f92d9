"""Report import cycles (module- and function-level imports) and private names used across autodl modules."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "autodl"
ROOT = Path(__file__).resolve().parent.parent / "plugins"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Map every module name of the package to its file.

    :param root: the folder that holds the ``autodl`` package.
    :returns: dotted module name -> path (a package is named for its ``__init__.py``).
    """
    found: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _base(module: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if node.level == 0:
        return node.module
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], list[str]]:
    """Collect the autodl modules one module imports anywhere, and the private names it takes from them.

    :param module: dotted name of the module.
    :param path: its file.
    :param modules: every module of the package (from :func:`module_files`).
    :returns: (imported module names, private-name uses as ``"module: other._name"`` lines).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    private: list[str] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE and alias.name in modules:
                    targets.add(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node, is_package)
            if not base or base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    targets.add(sub)
                    aliases[alias.asname or alias.name] = sub
                elif base in modules:
                    targets.add(base)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{module}: from {base} import {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            private.append(f"{module}: {aliases[node.value.id]}.{node.attr}")
    targets.discard(module)
    return targets, private


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a directed graph.

    :param graph: node -> nodes it points to.
    :returns: every component, each sorted, in discovery order.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def analyse(root: Path = ROOT) -> tuple[list[list[str]], list[str]]:
    """Find the import cycles and the private names used across modules.

    :param root: the folder that holds the ``autodl`` package.
    :returns: (components of more than one module, private-name uses).
    """
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    private: list[str] = []
    for name, path in modules.items():
        graph[name], uses = imports_of(name, path, modules)
        private.extend(uses)
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    return cycles, sorted(set(private))


def main() -> int:
    """Print the cycles and private names; exit 1 when there is either."""
    cycles, private = analyse()
    for component in cycles:
        print("cycle: " + " ".join(component))
    for use in private:
        print("private: " + use)
    return 1 if cycles or private else 0


if __name__ == "__main__":
    sys.exit(main())
