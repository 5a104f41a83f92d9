"""Every third-party module the package imports is installed by ``pip install autodl[...]``.

Seen (issue 12 follow-up, a fresh virtual environment with ``pip install "autodl-0.1.0-py3-none-any.whl[airflow,docker]"``):
the GPU page answered 500 (``ModuleNotFoundError: No module named 'matplotlib'`` from ``autodl/ui/plots.py``)
and ``autodl exporter`` exited 1 (``No module named 'prometheus_client'``), because ``pyproject.toml`` did
not declare them; ``requirements.txt`` (the development environment) and ``test_wheel_install.py`` (which
installs the wheel on top of the development environment's packages, having no network) both hid it.

The check reads the imports from the source (no import is executed) and the declared requirements
from ``pyproject.toml``, and maps modules to distributions through this environment's installed
metadata (``importlib.metadata.packages_distributions``).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "plugins" / "autodl"

# modules that only some installs need, and the extra that brings each: the Airflow shell (operators,
# triggers, plugin, GPU page) runs inside Airflow; the launchers' clients; Paddle runs in the training's
# and the sandboxed probe's interpreter, not in autodl's.
EXTRA_FOR_MODULE = {
    "airflow": "airflow",
    "fastapi": "airflow",
    "jinja2": "airflow",
    "docker": "docker",
    "requests": "docker",  # docker-py's transport: its errors caught where the dry run talks to the engine
    "kubernetes": "kubernetes",
    "urllib3": "kubernetes",  # the kubernetes client's transport: its timeouts caught where the dry-run pod is read
    "paddle": "paddle",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _closure(names: set[str]) -> set[str]:
    """``names`` and everything they require when installed (extras' requirements left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _imports() -> dict[str, set[str]]:
    """Third-party top-level module -> the package files importing it (any scope)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "include":  # example training scripts: the user's code, not autodl's
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in {"autodl", "__future__"}:
                    continue
                found.setdefault(top, set()).add(str(rel))
    return found


def test_the_scan_sees_the_imports_it_must_check():
    """The scan is not vacuous: it finds the imports that were missing from the wheel's requirements."""
    imports = _imports()
    assert "ui/plots.py" in imports["matplotlib"]
    assert "exposition.py" in imports["prometheus_client"]
    assert "store.py" in imports["alembic"]


@pytest.mark.parametrize("module", sorted(_imports()))
def test_every_imported_module_is_declared(module):
    """A module imported by the core is a direct dependency; one of the Airflow shell, a launcher or the
    training is brought by its extra (directly or through what the extra installs)."""
    distributions = {_norm(d) for d in metadata.packages_distributions().get(module, [])}
    assert distributions, f"{module!r} is imported by autodl but not installed here: add it to requirements.txt"
    project = _project()
    core = {_norm(Requirement(r).name) for r in project["dependencies"]}
    extra = EXTRA_FOR_MODULE.get(module)
    if extra is None:
        allowed, where = core, "[project] dependencies"
    else:
        extra_reqs = {_norm(Requirement(r).name) for r in project["optional-dependencies"][extra]}
        allowed, where = _closure(extra_reqs | core), f"the {extra!r} extra"
    files = ", ".join(sorted(_imports()[module]))
    assert distributions & allowed, (
        f"{files} import(s) {module!r} (distribution {sorted(distributions)}), which {where} in pyproject.toml "
        f"does not install: declare it there"
    )
