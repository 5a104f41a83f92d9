"""What a fresh Airflow user found with `autodl leases --release` (airtest): the messages of a manual release,
a training stopped by hand reported as a crash, empty run keys listing leases, and whole 100k-character
arguments echoed back. Real trainings (local launcher), the real store and the real CLI (in this process)."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from autodl import pipeline
from autodl.errors import TrainingFailed
from autodl.launch.local import LocalLauncher
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.types import LaunchHandle, MemoryBreakdown, ResourceProfile


def profile_out(tmp_path, body: str) -> dict:
    script = tmp_path / "train.py"
    script.write_text(body)
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=2**20)
    p = ResourceProfile(script=str(script), params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8, activation_bytes_per_sample=2**17, num_gpus=1)
    return {"profile": p.to_json(), "spec_path": None, "script": str(script)}


CTX = pipeline.RunContext(run_key="dag.train.run1", dag_id="dag", run_id="run1", user="alice")


def launched(tmp_path, body: str = "import time\ntime.sleep(300)\n") -> tuple[dict, dict]:
    out = profile_out(tmp_path, body)
    sel = pipeline.step_select(CTX, out, log=lambda _l: None)
    handle = pipeline.step_launch(CTX, out, sel, log=lambda _l: None)
    return sel, handle


def test_a_training_stopped_by_leases_release_is_stopped_not_a_crash(tmp_path):
    """Seen: a training stopped by `autodl leases --release` was reported by the collect step as "failed with
    exit code 143" (137 after SIGKILL), which reads like a crash or an OOM kill, and the run's record said
    outcome=failed. Now the release marks the lease before it signals, the collect step says "stopped by autodl
    leases --release (by alice at <time>)", and the record's outcome is `stopped` with who and when, also after
    the Airflow run's own release-and-record step wrote it again."""
    sel, handle = launched(tmp_path)
    lines: list[str] = []
    raised: list[BaseException] = []

    def collect():
        try:
            pipeline.step_collect(CTX, handle, log=lines.append, interval_s=0.1)
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            raised.append(exc)

    follower = threading.Thread(target=collect)
    follower.start()
    time.sleep(0.5)  # let it follow a while (either order ends the same: the mark is written before the stop)
    result = pipeline.release_by_hand(CTX.run_key, user="alice", log=lines.append)
    follower.join()
    assert result["training"] == "stopped" and result["outcome"] == "stopped" and result["lease_released"]
    assert result["stopped"]["by"] == "alice" and not result["forced"]
    [exc] = raised
    assert isinstance(exc, pipeline.CollectStopped) and exc.status == "stopped"
    assert re.search(r"was stopped by autodl leases --release \(by alice at \d{4}-\d\d-\d\dT[\d:]+\+00:00\)", str(exc))
    assert "failed with exit code" not in str(exc)

    # the Airflow run's own release step (all_done) runs after: the lease is gone, the record stays `stopped`
    rel_lines: list[str] = []
    again = pipeline.step_release_and_record(CTX, script=None, spec_path=None, profile_out=None, selection=sel,
                                             handle_json=handle, metrics_json=None, log=rel_lines.append)
    assert again["outcome"] == "stopped" and not again["lease_released"]
    assert any("held no lease any more (already released: stopped by autodl leases --release (by alice" in line
               for line in rel_lines), rel_lines
    assert not any("none held" in line for line in rel_lines)
    rec = RecordStore().get(CTX.run_key)
    assert rec.outcome == "stopped" and rec.stopped.by == "alice" and rec.oom is None
    assert rec.error.startswith("stopped: stopped by autodl leases --release (by alice at ")
    assert "exit code" not in rec.error and rec.error.count("stopped by autodl leases") == 1


def test_the_heartbeat_of_a_released_lease_says_it_was_stopped_by_hand(tmp_path):
    """Seen: after a manual release the collect step's heartbeat said "lease lost ... its devices may be booked
    by another run". It says who stopped it; a new lease of the same run key (a re-run) is not taken for the
    stopped one."""
    sel, handle = launched(tmp_path)
    pipeline.release_by_hand(CTX.run_key, user="alice", log=lambda _l: None)
    h = LaunchHandle.model_validate(handle)
    guard = pipeline.CollectGuard(CTX, h, LocalLauncher(), pipeline.CollectLimits(heartbeat_every_s=0.0),
                                  log=lambda _l: None, lease_id=sel.lease.lease_id)
    stopped = guard.check()
    assert stopped.status == "stopped" and "stopped by autodl leases --release (by alice at" in str(stopped)
    again = Ledger().book(CTX.run_key, ["GPU-x"])
    assert Ledger().stop_mark(again.lease_id) is None
    assert Ledger().stop_mark(sel.lease.lease_id).by == "alice"


def test_a_training_that_kills_itself_is_still_a_failure(tmp_path):
    """Exit 137 without a manual release (the OOM killer, a crash) stays `failed` with its exit code: only a
    marked stop is `stopped`."""
    sel, handle = launched(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(TrainingFailed, match="failed with exit code") as exc:
        pipeline.step_collect(CTX, handle, log=lambda _l: None, interval_s=0.05)
    assert not isinstance(exc.value, pipeline.CollectStopped)
    out = pipeline.step_release_and_record(CTX, script=None, spec_path=None, profile_out=None, selection=sel,
                                           handle_json=handle, metrics_json=None, log=lambda _l: None)
    assert out["outcome"] == "failed" and RecordStore().get(CTX.run_key).stopped is None


def test_release_says_what_it_released_and_json_says_the_same(tmp_path, autodl):
    """Seen: `autodl leases --release RUN` printed "released by hand ... after its Airflow run was lost"-style
    wording for a normal manual release, and "lease none held" next to "released". Now: which lease of which run
    on which devices, what happened to the training, the outcome; --json is one JSON object (log on stderr)."""
    sel, handle = launched(tmp_path)
    done = autodl("leases", "--release", CTX.run_key, env={"AUTODL_USER": "alice"}, check=False)
    assert done.returncode == 0, done.stderr
    lease_id, device = sel.lease.lease_id, sel.lease.device_ids[0]
    assert (f"released lease {lease_id} of run {CTX.run_key} held on devices {device}; its training was stopped; "
            "recorded outcome=stopped") in done.stdout
    assert "none held" not in done.stdout and "lost" not in done.stdout

    sel2, _ = launched(tmp_path)
    shown = autodl("leases", "--release", CTX.run_key, "--json", env={"AUTODL_USER": "alice"}, check=False)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["released"] is True and doc["lease_id"] == sel2.lease.lease_id and doc["run_key"] == CTX.run_key
    assert doc["device_ids"] == sel2.lease.device_ids and doc["training"] == "stopped"
    assert doc["outcome"] == "stopped" and doc["stopped"]["by"] == "alice" and doc["released_by"] == "alice"


def test_release_of_a_run_without_lease_releases_nothing_and_fails(autodl):
    """Seen: a run key that holds no lease got "lease none held" and yet "released". Now: "no lease is held by run
    R: nothing released", exit 6; --json: {"released": false, ...} on stdout, the same message on stderr."""
    text = autodl("leases", "--release", "dag.train.none", check=False)
    assert text.returncode == 6 and "no lease is held by run 'dag.train.none': nothing released" in text.stderr
    assert "released lease" not in text.stdout
    as_json = autodl("leases", "--release", "dag.train.none", "--json", check=False)
    assert as_json.returncode == 6
    doc = json.loads(as_json.stdout)
    assert doc["released"] is False and doc["run_key"] == "dag.train.none" and "nothing released" in doc["error"]


@pytest.mark.parametrize("key", ["", "   ", "\t"])
def test_an_empty_run_key_is_refused_not_a_listing(key, autodl):
    """Seen: `autodl leases --release ''` listed the leases (exit 0) as if --release had not been given. Now a
    usage error (exit 2) naming the argument."""
    Ledger().book("dag.train.keep", ["GPU-0"])
    proc = autodl("leases", "--release", key, check=False)
    assert proc.returncode == 2 and "argument --release: the run key is empty" in proc.stderr
    assert "live leases" not in proc.stdout and Ledger().get("dag.train.keep") is not None


def test_force_without_release_is_refused(autodl):
    """`autodl leases --force` listed the leases, --force silently ignored."""
    proc = autodl("leases", "--force", check=False)
    assert proc.returncode == 2 and "--force: only goes with --release" in proc.stderr


def test_a_100k_character_run_key_is_not_echoed_whole(autodl):
    """Seen: a 100,000-character run key came back whole in the error (4,000 characters of it after the
    message cut). Now the argument is refused naming its length, quoting at most a line of it."""
    key = "k" * 100_000
    for args in (("leases", "--release", key), ("leases", "--release", key, "--json"), ("runs", "--plot", key)):
        proc = autodl(*args, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "100,000 characters long" in proc.stderr and len(proc.stderr) + len(proc.stdout) < 800
        assert "k" * 100 not in proc.stderr


def test_a_long_argument_echoed_by_any_error_is_cut(autodl):
    """The kind: whatever code builds an error, the CLI cuts each long argument it quotes (a 500-character run
    key passes the length check and is quoted by the run store's "no run folder" error)."""
    key = "r" * 500
    proc = autodl("runs", "--plot", key, check=False)
    assert proc.returncode == 9 and "r" * 121 not in proc.stderr and "(500 characters)" in proc.stderr


def test_a_failed_runs_error_quotes_the_last_line_of_its_log(tmp_path):
    """A fresh user: the record of a training that died on an import said only "failed with exit code 1; its log:
    <path>" (twice); the exception it ended with is the first thing to know."""
    sel, handle = launched(tmp_path, "import no_such_module_for_autodl\n")
    with pytest.raises(TrainingFailed) as exc:
        pipeline.step_collect(CTX, handle, log=lambda _l: None, interval_s=0.05)
    assert "failed with exit code 1" in str(exc.value)
    assert "its log ends: \"ModuleNotFoundError: No module named 'no_such_module_for_autodl'\"" in str(exc.value)
