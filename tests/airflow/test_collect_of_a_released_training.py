"""The collect task of a training stopped by `autodl leases --release` (airtest).

Seen: the collect task failed with "training ... failed with exit code 143" (137 after SIGKILL), which reads
like a crash or an out-of-memory kill, when the user had stopped it by hand. The deferred collect's
completion (the trigger's "ended" event) now fails the task saying who stopped it and when."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from autodl import pipeline
from autodl.operators.steps import AutoDLCollectOperator
from autodl.types import MemoryBreakdown, ResourceProfile, RunMetrics


def test_the_deferred_collect_of_a_released_training_says_it_was_stopped_by_hand(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(300)\n")
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=2**20)
    p = ResourceProfile(script=str(script), params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8, activation_bytes_per_sample=2**17, num_gpus=1)
    out = {"profile": p.to_json(), "spec_path": None, "script": str(script)}
    ctx = pipeline.RunContext(run_key=pipeline.make_run_key("dag", "group", "run1"), dag_id="dag", run_id="run1",
                              user="carol")
    sel = pipeline.step_select(ctx, out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx, out, sel, log=lambda _l: None)
    pipeline.release_by_hand(ctx.run_key, user="carol", log=lambda _l: None)

    op = AutoDLCollectOperator(task_id="collect_metrics", group_id="group")
    ti = SimpleNamespace(dag_id="dag", task_id="group.collect_metrics", try_number=1,
                         xcom_pull=lambda task_ids: handle)
    context = {"ti": ti, "run_id": "run1", "dag_run": None}
    event = {"status": "ended", "exit_code": 143,
             "metrics": RunMetrics(source="process", duration_s=1.0, exit_code=143).model_dump(mode="json")}
    with pytest.raises(AirflowFailException) as exc:
        op.execute_complete(context, event)
    assert "stopped by autodl leases --release (by carol at " in str(exc.value)
    assert "failed with exit code" not in str(exc.value)
    assert "stopped by autodl leases --release (by carol" in pipeline.read_failures(ctx.run_key)["collect"]
