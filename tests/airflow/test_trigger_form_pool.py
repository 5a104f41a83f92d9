"""The trigger form's pool (airtest): a fresh user typed a pool name or a relative path and was refused.

Seen: the pool Param was an ``enum`` of absolute paths, so ``demo``, ``pools/demo.yaml`` or
``include/pools/demo.yaml`` failed the form's validation (and a conf ``{"pool": "include/pools/demo.yaml"}``
failed the trigger). Now the field is free text with proposals (``examples``), and the tasks resolve the value
against the deployment's include folder; a file that does not exist fails the profile step naming the field
and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from autodl.config import include_dir
from autodl.errors import SpecError
from autodl.operators.params import train_params
from autodl.pipeline import resolve_pool_source

DEMO = include_dir() / "pools" / "demo.yaml"


@pytest.mark.parametrize("typed", ["demo", "pools/demo.yaml", "include/pools/demo.yaml", "demo.yaml", str(DEMO)])
def test_pool_names_and_relative_paths_are_accepted_and_resolved(typed):
    pool = train_params(spec="include/specs/simple_cnn.yaml")["pool"]
    assert pool.resolve(typed) == typed  # the form takes it
    assert Path(resolve_pool_source(typed)) == DEMO  # the tasks read the shipped file


@pytest.mark.parametrize("typed", ["auto", "nvml", "prometheus+http://127.0.0.1:28210"])
def test_sources_pass_unchanged(typed):
    assert resolve_pool_source(typed) == typed


@pytest.mark.parametrize("typed", ["examples", "include/pools/nope.yaml", "/nowhere/pool.yaml", "x" * 5000])
def test_a_pool_file_that_does_not_exist_names_the_field_and_the_fix(typed):
    with pytest.raises(SpecError) as exc:
        resolve_pool_source(typed, field="pool (the trigger form's pool)")
    msg = str(exc.value)
    assert msg.startswith("pool (the trigger form's pool) ") and "no such pool file" in msg
    assert "choose auto, nvml, a pool name (demo" in msg.lower() and "pools/demo.yaml" in msg
    assert len(msg) < 1500


def test_the_operator_resolves_the_rendered_pool():
    from autodl.operators.steps import _pool

    assert Path(_pool("include/pools/demo.yaml")) == DEMO
    assert _pool("") is None and _pool("None") is None
    with pytest.raises(SpecError, match="trigger form's pool"):
        _pool("examples")


def test_the_cli_takes_a_pool_name_too(capsys):
    import json

    from tests.cli_helpers import run_cli

    proc = run_cli(capsys, "inventory", "--pool", "demo", "--json", cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["devices"]) == 4


def test_a_conf_of_huge_or_many_unknown_keys_is_named_in_a_line_each():
    """The kind of the 100k run key: a trigger conf key of 100,000 characters came back whole in the profile
    step's error, and 10,000 unknown keys made a message of all of them."""
    from autodl.operators.params import check_conf

    with pytest.raises(SpecError) as exc:
        check_conf({"k" * 100_000: 1, **{f"key{i}": i for i in range(10_000)}}, ["script", "pool"])
    msg = str(exc.value)
    assert len(msg) < 2000 and "k" * 100 not in msg and "more" in msg
