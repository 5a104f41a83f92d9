"""Calibration from out-of-memory runs: tied to what failed (script content, configuration, batch, device kind,
host vs device memory), said from what to what after which run, cleared by ``autodl calibration --clear`` and by
a change to the script, the same in ``autodl profile`` and the DAG's profile step.

Seen in a real Airflow (issue 25): after one training that allocated 64 GiB failed, every later run of the same
script was "needs 64 GiB, nothing fits" whatever its spec, with batch advice for an allocation that did not
depend on the batch; ``autodl profile`` still said 0.53 GiB; a host-memory failure raised the device estimate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autodl import cli, pipeline
from autodl.oom import calibration_tag, explain
from autodl.records import RecordStore, find_calibration
from autodl.types import RunRecord

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def gpu_oom(request_gib: float, used_gib: float = 10.0, free_gib: float = 0.5) -> str:
    """Paddle's CUDA allocator message (``cuda_allocator.cc``)."""
    return (f"ResourceExhaustedError: Out of memory error on GPU 0. Cannot allocate {request_gib:.6f}GB memory on GPU 0, "
            f"{used_gib:.6f}GB memory has been allocated and available memory is only {free_gib * 1024:.6f}MB.\n")


HOST_OOM = "MemoryError: (ResourceExhausted) Fail to alloc memory of 68719476736 size, error code is 12.\n"


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "simple_cnn.py"
    shutil.copy(REPO / "include/scripts/simple_cnn.py", path)
    return path


def spec_file(tmp_path, script, batch: int, shape: list[int] | None = None) -> Path:
    spec = tmp_path / f"spec_{batch}_{shape}.yaml"
    task = {"script": str(script), "batch_size_per_gpu": batch, **({"input_shape": shape} if shape else {})}
    spec.write_text(json.dumps({"task": task}))
    return spec


def estimate(tmp_path, script, batch: int, shape: list[int] | None = None):
    """The DAG's profile step's estimate (:func:`autodl.pipeline.profile_run`, calibrated)."""
    _spec, profile = pipeline.profile_run(None, str(spec_file(tmp_path, script, batch, shape)), probe=False)
    return profile


def record_oom(key: str, profile, text: str, *, declared: bool = False, model: str = "A100-SXM4-80GB"):
    """A failed run's record as the release-and-record step writes it: the OOM explained, then tagged."""
    oom = explain([text], profile=profile, run_on_cpu=declared, device_total_bytes=80 * GiB).model_dump()
    oom = calibration_tag(oom, script=profile.script, profile=profile.to_json(), device_kind="cpu" if declared else model)
    RecordStore().write(RunRecord(run_key=key, script=profile.script, outcome="failed", declared_pool=declared,
                                  profile=profile.to_json(), oom=oom, error="out of memory"))
    return oom


def calibration_notes(profile) -> list[str]:
    return [f.message for f in profile.findings if f.code == "oom-calibration"]


def test_an_oom_raises_the_next_estimate_of_the_same_script_and_says_from_what_after_which_run(tmp_path, script):
    before = estimate(tmp_path, script, 32)
    record_oom("d.g.run1", before, gpu_oom(64.0))
    after = estimate(tmp_path, script, 32)
    assert after.peak_memory_bytes >= 64 * GiB > before.peak_memory_bytes
    [note] = calibration_notes(after)
    assert f"raised from {before.peak_memory_bytes / GiB:.2f} to {after.peak_memory_bytes / GiB:.2f} GiB" in note
    assert "after run d.g.run1" in note and "A100-SXM4-80GB at batch 32" in note
    assert "autodl calibration --clear" in note


def test_a_changed_script_or_another_configuration_is_not_calibrated(tmp_path, script):
    before = estimate(tmp_path, script, 32)
    record_oom("d.g.run1", before, gpu_oom(64.0))
    other = estimate(tmp_path, script, 32, shape=[3, 64, 64])  # another spec's input: not what failed
    assert not calibration_notes(other) and other.peak_memory_bytes < 64 * GiB
    script.write_text(script.read_text() + "\n# fixed the leak\n")
    changed = estimate(tmp_path, script, 32)
    assert not calibration_notes(changed) and changed.peak_memory_bytes == before.peak_memory_bytes


def test_a_host_memory_failure_never_raises_the_device_estimate(tmp_path, script):
    before = estimate(tmp_path, script, 32)
    oom = record_oom("d.g.cpu", before, HOST_OOM, declared=True)
    assert oom["memory"] == "host" and oom["calibration"]["device_kind"] == "cpu"
    after = estimate(tmp_path, script, 32)
    assert after.peak_memory_bytes == before.peak_memory_bytes
    assert any("ran out of host (CPU) memory: the device estimate is not raised" in n for n in calibration_notes(after))


def test_an_allocation_that_fails_the_same_at_two_batch_sizes_gets_no_batch_advice(tmp_path, script, catalog):
    """64 GiB asked for at batch 32 and at batch 8: it does not scale with the batch, so no smaller batch is
    worked out to fit (the issue saw "a batch of at most 46 would fit")."""
    record_oom("d.g.b32", estimate(tmp_path, script, 32), gpu_oom(100.0))
    record_oom("d.g.b8", estimate(tmp_path, script, 8), gpu_oom(100.0))
    found = find_calibration(str(script), 16)
    assert found.scaling == "fixed" and found.floor_bytes >= 100 * GiB
    after = estimate(tmp_path, script, 16)
    assert after.peak_memory_bytes >= 100 * GiB
    assert any("does not scale with the batch" in n for n in calibration_notes(after))
    a100 = catalog.get("A100-SXM4-80GB")
    # unmeasured (probe=False) the model's size is unknown: no largest batch is worked out, so none is advised
    assert after.max_batch_size(a100.memory_bytes, 0.85) is None
    assert after.peak_at_batch(1) >= 100 * GiB


def test_an_allocation_that_grows_with_the_batch_is_rescaled(tmp_path, script):
    record_oom("d.g.b32", estimate(tmp_path, script, 32), gpu_oom(60.0))
    record_oom("d.g.b8", estimate(tmp_path, script, 8), gpu_oom(15.0))
    found = find_calibration(str(script), 16)
    assert found.scaling == "scales" and 30 * GiB < found.floor_bytes < 80 * GiB
    assert "grew with the batch" in calibration_notes(estimate(tmp_path, script, 16))[0]


def test_cli_profile_matches_the_dag_and_calibration_clear_forgets(tmp_path, script, capsys):
    before = estimate(tmp_path, script, 32)
    record_oom("d.g.run1", before, gpu_oom(64.0))
    spec = spec_file(tmp_path, script, 32)
    assert cli.main(["profile", "--spec", str(spec), "--no-probe", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["peak_memory_bytes"] == estimate(tmp_path, script, 32).peak_memory_bytes >= 64 * GiB
    assert cli.main(["calibration", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["run_key"], r["memory"], r["batch_size"]) for r in listed] == [("d.g.run1", "device", 32)]
    assert cli.main(["calibration", "--clear", "--script", str(script), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"cleared": ["d.g.run1"]}
    assert estimate(tmp_path, script, 32).peak_memory_bytes == before.peak_memory_bytes
    assert RecordStore().get("d.g.run1").oom["calibration"]["cleared_at"]  # the record itself stays


def test_leases_reap_json_prints_json(capsys):
    from autodl.ledger import Ledger

    Ledger().book("d.g.old", ["dev0"], host="h", model="A100-SXM4-40GB", ttl_s=-1)
    assert cli.main(["leases", "--reap", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reaped"] == ["d.g.old"] and isinstance(out["log"], list)
    # booked, never launched (on Celery: no worker of the host's queue took the launch): the record says so
    error = RecordStore().get("d.g.old").error
    assert "expired before its training was launched: booked on host h" in error and "Celery worker" in error
