"""Every `autodl` subcommand as a user mistypes it (airtest): each option that takes a value, given an empty, a
100,000-character, a unicode or a negative value. Seen: an empty --release listed leases, an empty --pool or
--trace silently meant the default, --exporter --host with a long name and --simulate --pool-scale inf were
"internal error ... a bug in autodl", and long values came back whole (100k characters) in errors.

Each case must end as a result (exit 0) or an error that is not exit 1 (the code of a bug in autodl), never a
traceback, and never quote more than a line of the value."""

from __future__ import annotations

import argparse

import pytest

from autodl import cli
from tests.cli_helpers import run_cli

BIG = "x" * 100_000
VALUES = {"empty": "", "huge": BIG, "unicode": "é漢字🙂", "negative": "-1", "dashdash": "--"}
BASE = {"plan": ["include/specs/simple_cnn.yaml", "--no-probe"],
        "simulate": ["--jobs", "3", "--policies", "fifo_first_fit"]}
SKIP = {("simulate", "--jobs"), ("simulate", "--policies")}  # given in BASE (a second one would override it)


def cases():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sub.choices.items():
        for action in sp._actions:
            if action.nargs == 0 or isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[0] if action.option_strings else None
            if (name, flag) in SKIP or (name == "plan" and flag is None):
                continue
            for label, value in VALUES.items():
                yield pytest.param(name, flag, value, id=f"{name}-{flag or action.dest}-{label}")


def run(argv: list[str], capsys) -> tuple[int, str]:
    """``autodl ARGV`` in this process: the exit status and stdout and stderr together."""
    rc, out, err = run_cli(capsys, *argv)
    return rc, out + err


@pytest.mark.parametrize("command,flag,value", list(cases()))
def test_every_argument_refuses_bad_values_clearly(command, flag, value, capsys, tmp_path, monkeypatch):
    repo = cli.Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    if command == "simulate" and flag == "--plot" and value not in ("", BIG):
        value = str(tmp_path / value)  # a valid new file: the plot is written, not into the repository
    if command == "runs" and flag == "--out" and value not in ("", BIG):
        value = str(tmp_path / value)
    head = [command, *BASE.get(command, [])]
    argv = head + ([flag, value] if flag else [value])
    if value.startswith("-") and flag:
        argv = head + [f"{flag}={value}"]
    rc, out = run(argv, capsys)
    assert rc != 1, out[-2000:]
    assert "Traceback" not in out
    if value == BIG:
        assert rc != 0 and "x" * 200 not in out and len(out) < 3000, out[:3000]
    if value == "":
        assert rc != 0, f"an empty {flag or 'argument'} was taken: {out[:500]}"
    if value == "--" and flag:  # fresh user: simulate --load=-- was "internal error ... TypeError" (exit 1)
        assert rc == 2, out[-1000:]
