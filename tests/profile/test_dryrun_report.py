"""The dry-run child's report model (issue 20 item 7): what a forged report can and cannot make the parent believe.

The child writes its report from inside the user's process; the script can write the file whole. Each kind of bad
field is refused (a ValueError naming it: the dry run falls back) or dropped, as the hand-written checks did.
"""

import json
from pathlib import Path

import pytest

from autodl.profile.dryrun import ChildOutput, read_back, summarize
from autodl.profile.dryrun_report import MAX_BATCH, SIG_TENSORS, DryRunReport, dryrun_report
from autodl.profile.probe import REPORT_MAX_BYTES

STEP = {"batch": 4, "peak": 5, "start_bytes": 0, "fwd_bwd_peak": 4, "update_peak": 5}
REAL = Path(__file__).parents[1] / "cases" / "estimator" / "fresh" / "gpt_medium_native_dry_run_report.json"


def _with(**fields) -> str:
    return json.dumps({"steps": [STEP], **fields})


@pytest.mark.parametrize("fields, why", [
    ({"steps": [dict(STEP, peak=REPORT_MAX_BYTES + 1)]}, "steps.0.peak"),
    ({"steps": [dict(STEP, peak=5.0)]}, "steps.0.peak"),  # a float is not a byte count
    ({"steps": [dict(STEP, peak=True)]}, "steps.0.peak"),  # nor a bool
    ({"steps": [{k: v for k, v in STEP.items() if k != "update_peak"}]}, "steps.0.update_peak"),
    ({"steps": [dict(STEP, batch=MAX_BATCH + 1)]}, "steps.0.batch"),
    ({"steps": [dict(STEP, seconds=1e8)]}, "steps.0.seconds"),
    ({"steps": [dict(STEP, fwd_flops="many")]}, "steps.0.fwd_flops"),
    ({"steps": [dict(STEP, fwd_calls=1 << 21)]}, "steps.0.fwd_calls"),
    ({"steps": [5]}, "steps.0"),
    ({"inputs": [{"shape": [1]}] * (SIG_TENSORS + 1)}, "inputs"),
    ({"inputs": [{"shape": [1] * 17}]}, "inputs.0.shape"),
    ({"inputs": [{"shape": [-1]}]}, "inputs.0.shape.0"),
    ({"inputs": [{"shape": [2], "min": 1 << 63}]}, "inputs.0.min"),
    ({"replay": [[2]]}, "replay.0"),
    ({"replay": [[2, 1, 0]]}, "replay.0"),
    ({"replay": [[2, 1]] * 9}, "replay"),
    ({"created_batches": [[0, 4]]}, "created_batches.0.0"),
    ({"num_workers": [None]}, "num_workers.0"),
    ({"num_workers": [70_000]}, "num_workers.0"),
    ({"loaders": [{"batch_size": 0}]}, "loaders.0.batch_size"),
    ({"loaders": ["x"]}, "loaders.0"),
    ({"error": "boom"}, "error"),
    ({"eval_partial": 5}, "eval_partial"),
    ({"exit_code": 1 << 32}, "exit_code"),
    ({"plan": {"then": [0]}}, "plan.then.0"),
    ({"notes": ["n"] * 65}, "notes"),
    ({"params": 5, "trainable": 9}, "more trainable parameters than parameters"),
])
def test_each_kind_of_forged_field_is_refused_naming_it(fields, why):
    with pytest.raises(ValueError, match=why.replace(".", r"\.")):
        dryrun_report(_with(**fields))


def test_fields_the_parent_does_not_trust_are_dropped_not_refused():
    """Unknown keys, an AMP level Paddle has not, a loader batch that is no integer, a frame that is no object, a
    bad line number: dropped or None, and the rest of the report is kept."""
    r = dryrun_report(_with(forged_key=1, amp=["O1", "O3"], loaders=[{"batch_size": "8"}], conv="yes",
                            error={"frames": [5, {"file": "a.py", "line": 0}], "errno": "2", "last_frame": []},
                            plan=[4], distributed_calls=["init_parallel_env"] * 100, reduced=1))
    assert "forged_key" not in r and "plan" not in r and r["amp"] == ["O1"] and r["conv"] is None
    assert r["loaders"] == [{"first_sample": None, "batch_size": None}] and r["reduced"] is False
    assert r["error"]["frames"] == [{"file": "a.py", "func": None, "code": "", "line": None}]
    assert r["error"]["errno"] is None and r["error"]["last_frame"] is None and r["error"]["type"] == "Exception"
    assert len(r["distributed_calls"]) == 64 and r["steps"][0]["measured"] is False


def test_keys_the_child_sets_only_sometimes_stay_absent_when_unset():
    """A signature's min/max, an evaluation's steady_peak and the plan are in the report only when the child set
    them (summarize reads their presence)."""
    r = dryrun_report(_with(inputs=[{"shape": [2, 3]}], evals=[dict(STEP, grad=True)]))
    assert r["inputs"] == [{"shape": [2, 3], "dtype": "?"}] and "steady_peak" not in r["evals"][0]
    assert "plan" not in r
    r = dryrun_report(_with(inputs=[{"shape": [2], "dtype": "int64", "min": 0, "max": 9}], plan={"then": [8]},
                            evals=[dict(STEP, steady_peak=3)]))
    assert r["inputs"][0]["max"] == 9 and r["plan"] == {"native": None, "then": [8]}
    assert r["evals"][0]["steady_peak"] == 3


def test_a_real_report_is_kept_as_plain_json_values():
    raw = dryrun_report(REAL.read_text())
    assert raw["steps"] and all(isinstance(s["fwd_flops"], float) for s in raw["steps"])
    assert json.loads(json.dumps(raw)) == raw  # lists, not tuples: DryRun.raw is stored as JSON
    assert set(raw) == set(DryRunReport.model_fields) - ({"plan"} - set(raw))


def test_a_forged_report_is_a_tool_failure_naming_the_field():
    """read_back turns the refusal into report_error; summarize makes it a tool-failure whose reason names the
    field, so the profile falls back as before."""
    raw = read_back(ChildOutput(result=_with(steps=[dict(STEP, peak=-5)]).encode()))
    assert set(raw) == {"report_error"} and "steps.0.peak is -5" in raw["report_error"]
    dr = summarize(raw, None, target_batch=None, timeout=60)
    assert dr.outcome == "tool-failure" and "steps.0.peak" in dr.reason
