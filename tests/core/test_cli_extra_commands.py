"""Subcommands of other distributions (the ``autodl.commands`` entry point group): the simulator's ``simulate``
comes from ``autodl-sim`` (sim/), and an extra that cannot be imported never takes the product's CLI down."""

from __future__ import annotations

import sys

from autodl.cli import build_parser


def _subcommands(parser) -> set[str]:
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(action.choices)


def _fake_distribution(root, name: str, target: str) -> None:
    info = root / f"{name}-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[autodl.commands]\n{name} = {target}\n")


def test_simulate_comes_from_the_installed_simulator_distribution():
    import autodl_sim.cli

    assert "simulate" in _subcommands(build_parser())
    assert autodl_sim.cli.__name__ == "autodl_sim.cli"


def test_an_extra_command_that_cannot_load_is_left_out_with_a_note(tmp_path, monkeypatch, capsys):
    _fake_distribution(tmp_path, "brokenextra", "autodl_no_such_module.cli:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    commands = _subcommands(build_parser())
    assert "brokenextra" not in commands and {"profile", "plan", "leases", "queue"} <= commands
    err = capsys.readouterr().err
    assert "'brokenextra' command" in err and "ModuleNotFoundError" in err


def test_an_extra_command_registers_its_subparser(tmp_path, monkeypatch):
    pkg = tmp_path / "autodl_extra_hello"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "def register(sub):\n    p = sub.add_parser('hello', help='says hello')\n    p.set_defaults(func=lambda a: 0)\n")
    _fake_distribution(tmp_path, "hello", "autodl_extra_hello:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "hello" in _subcommands(build_parser())
    finally:
        sys.modules.pop("autodl_extra_hello", None)


def test_the_products_own_command_does_not_load_the_extras(tmp_path, monkeypatch, capsys):
    """``autodl profile`` never imports another distribution's command (loading ``simulate`` imports the
    simulator: 0.6 s of a cached profile's 2 s); ``--help`` and the extra's own name still load them."""
    _fake_distribution(tmp_path, "brokenextra", "autodl_no_such_module.cli:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    own = _subcommands(build_parser(["profile", "train.py"]))
    assert "brokenextra" not in own and "simulate" not in own and "profile" in own
    assert "brokenextra" not in capsys.readouterr().err     # it was never tried
    assert "simulate" in _subcommands(build_parser(["--help"]))
    assert "simulate" in _subcommands(build_parser(["simulate", "--jobs", "3"]))
    assert "'brokenextra' command" in capsys.readouterr().err
