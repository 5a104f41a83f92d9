"""The dry-run child's config (issue 20 item 7): one model owned by the parent, every default there once."""

import json
import re

import pytest
from pydantic import ValidationError

from autodl.profile.dryrun import CHILD, DRY_RUN_BUDGET_S, DRY_RUN_TENSOR_BUDGET_BYTES, DryRunConfig


def test_the_child_reads_every_key_of_the_parents_config_without_a_default_of_its_own():
    """The child once had ``CFG.get("budget_s") or 40.0`` and ``or (3 << 30)``: copies of the parent's constants
    that could drift. Now every key it reads is a field of DryRunConfig and it reads none with a fallback (the child
    is the package ``CHILD``: every module of it)."""
    source = "\n".join(module.read_text() for module in sorted(CHILD.glob("*.py")))
    assert "batch.py" in {module.name for module in CHILD.glob("*.py")}
    assert "CFG.get(" not in source
    read = set(re.findall(r'CFG\["(\w+)"\]', source))
    assert read and read <= set(DryRunConfig.model_fields), read - set(DryRunConfig.model_fields)
    assert set(DryRunConfig.model_fields) - read == {"container"}  # the container entry's section, not the child's


def test_the_config_written_holds_the_parents_defaults():
    written = json.loads(DryRunConfig(script="/w/train.py").model_dump_json())
    assert written["budget_s"] == DRY_RUN_BUDGET_S and written["mem_budget_bytes"] == DRY_RUN_TENSOR_BUDGET_BYTES
    assert written["reduce"] is True and written["argv"] == [] and written["target_batch"] is None


def test_a_key_the_child_does_not_know_is_refused():
    with pytest.raises(ValidationError, match="budget_seconds"):
        DryRunConfig(script="/w/train.py", budget_seconds=10)
