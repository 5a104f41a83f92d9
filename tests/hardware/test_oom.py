"""OOMs explained (case launch/oom_at_step3.py) and fed back to the estimate."""

from __future__ import annotations

import shutil

import pytest

from autodl import pipeline
from autodl.config import default_pool_file
from autodl.errors import LaunchError
from autodl.oom import explain, find_oom, floor_at_batch, to_bytes
from autodl.records import RecordStore, oom_floor
from tests.hardware.conftest import CASES, GiB, MiB

MESSAGE = ("ResourceExhaustedError: \n\nOut of memory error on GPU 0. Cannot allocate 1.234375GB memory on GPU 0, "
           "9.852539GB memory has been allocated and available memory is only 612.312500MB.\n\n"
           "Please check whether there is any other process using GPU 0.\n")


def test_paddle_sizes_are_powers_of_1024():
    """Paddle's HumanReadableSize: B, kB, MB, GB, TB in powers of 1024 (paddle/utils/string/printf.h)."""
    assert to_bytes("1.234375", "GB") == int(1.234375 * GiB) and to_bytes("612.312500", "MB") == int(612.3125 * MiB)
    assert to_bytes("39.250000", "kB") == int(39.25 * 1024) and to_bytes("0.000000", "B") == 0


@pytest.mark.parametrize("text,device,requested,free", [
    (MESSAGE, "GPU 0", int(1.234375 * GiB), int(612.3125 * MiB)),
    ("Out of memory error on npu:0. Cannot allocate 1.000000GB memory on npu:0, available memory is only 512.000000MB.",
     "npu:0", GiB, 512 * MiB),
    ("Out of memory error on npu 1. total memory is 32.000000GB, used memory is 31.500000GB, available memory is only "
     "512.000000MB.", "npu 1", None, 512 * MiB),
    ("Cannot allocate 2.000000GB in Place(cpu):0, available 1.000000GB, total 16.000000GB, used 15.000000GB.",
     "Place(cpu):0", 2 * GiB, GiB),
])
def test_every_paddle_allocator_message(text, device, requested, free):
    """The messages of Paddle's CUDA, custom-device (two forms) and host allocators."""
    kind, fields = find_oom(["step 1\n" + text])
    assert fields["device"] == device and fields.get("req") == requested and fields["free"] == free


def test_no_oom_in_an_ordinary_failure():
    assert find_oom(["Traceback...\nValueError: bad shape\n"]) is None
    assert explain(["ZeroDivisionError"]) is None


def test_floor_rescales_with_the_batch():
    oom = {"wanted_bytes": 12 * GiB, "fixed_bytes": 2 * GiB, "batch_size": 8}
    assert floor_at_batch(oom, 8) == 12 * GiB and floor_at_batch(oom, 4) == 7 * GiB
    assert floor_at_batch({"wanted_bytes": None}, 4) is None


def test_oom_at_step3_is_recorded_explained_and_raises_the_next_estimate(tmp_path):
    """Case oom_at_step3.py: a training dies after 2 steps with Paddle's out-of-memory message (exit 1). The record
    says OOM, what was needed vs free, the allocator strategy in use (as the training itself reported it), and the
    batch that would fit; the next estimate for the same script is not below what failed."""
    script = tmp_path / "oom_at_step3.py"
    shutil.copy(CASES / "launch" / "oom_at_step3.py", script)
    pool = str(default_pool_file())
    ctx = pipeline.RunContext(run_key="dag.oom.run1", dag_id="dag")
    profile_out = pipeline.step_profile(str(script), None, pool=pool, probe=False, run_key=ctx.run_key, log=lambda _l: None)
    before = profile_out.profile.peak_memory_bytes
    batch = profile_out.profile.batch_size
    selection = pipeline.step_select(ctx, profile_out, pool=pool, log=lambda _l: None)
    handle = pipeline.step_launch(ctx, profile_out, selection, log=lambda _l: None)
    lines: list[str] = []
    with pytest.raises(LaunchError, match="out of memory on GPU 0: asked for 1.23 GiB with 0.60 GiB free"):
        pipeline.step_collect(ctx, handle, log=lines.append, interval_s=0.2)
    assert any(line.startswith("OUT OF MEMORY:") for line in lines)
    pipeline.step_release_and_record(ctx, script=str(script), spec_path=None, profile_out=profile_out,
                                     selection=selection, handle_json=handle, metrics_json=None, log=lambda _l: None)
    record = RecordStore().get(ctx.run_key)
    assert record.outcome == "failed" and record.oom is not None and "out of memory" in record.error
    oom = record.oom
    assert oom["requested_bytes"] == int(1.234375 * GiB) and oom["free_bytes"] == int(612.3125 * MiB)
    assert oom["device_used_bytes"] == round(9.852539 * GiB)
    assert oom["allocator_strategy"] == "auto_growth" and oom["allocator_strategy_source"] == "training"
    assert oom["batch_size"] == batch and oom["fitting_batch_size"] is not None and oom["fitting_batch_size"] < batch
    assert oom["wanted_bytes"] >= oom["device_used_bytes"] + oom["requested_bytes"] - 1
    # the run's own allocated/reserved peaks (the CPU build's host allocator here) sit beside the estimate
    assert record.reserved_peak_bytes and record.allocated_peak_bytes and record.estimated_peak_bytes == before
    floor = oom_floor(record.script, batch)
    assert floor is not None and floor[1] == ctx.run_key and floor[0] > before
    _spec, again = pipeline.profile_run(str(script), None, probe=False)
    assert again.peak_memory_bytes == floor[0] >= oom["wanted_bytes"] - 1
    assert any(f.code == "oom-calibration" and ctx.run_key in f.message for f in again.findings)
