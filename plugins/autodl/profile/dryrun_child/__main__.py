"""Entry of the dry-run child, run by path: ``python .../dryrun_child CONFIG.json``.

The folder is loaded as the package ``_autodl_dryrun_child`` (its modules import one another relatively), and the
folder Python put first on ``sys.path`` is taken off: the user's script imports its own ``state`` or ``report``,
never the child's. :mod:`.readings` is imported first: it imports Paddle and times that import.
"""

import importlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "_autodl_dryrun_child"
"""The name the child's package is loaded under: none a user's script imports."""


def load_package():
    """Import this folder as :data:`PACKAGE` (without it on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location(PACKAGE, os.path.join(HERE, "__init__.py"),
                                                  submodule_search_locations=[HERE])
    if spec is None or spec.loader is None:
        raise ImportError(f"the dry-run child's package cannot be loaded from {HERE}")
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == HERE:
        del sys.path[0]
    load_package()
    importlib.import_module(f"{PACKAGE}.readings")
    importlib.import_module(f"{PACKAGE}.run").main()
