"""The autodl package is layered: no import cycle (counting function-level imports), no private names across modules."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_graph.py"


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tarjan_finds_a_two_module_cycle_and_leaves_a_chain_alone():
    components = _import_graph().strongly_connected({"a": {"b"}, "b": {"a", "c"}, "c": set()})
    assert sorted(c for c in components if len(c) > 1) == [["a", "b"]]


def test_package_has_no_import_cycle():
    cycles, _ = _import_graph().analyse()
    assert cycles == []


def test_no_module_uses_a_private_name_of_another():
    _, private = _import_graph().analyse()
    assert private == []
