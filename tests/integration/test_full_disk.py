"""A full disk, for real (issue 23, item 4): a 512 KiB tmpfs mounted as autodl's home, a run's output folder and the
SQLite store's folder, filled to ENOSPC. Each writer fails with autodl's own error naming the disk and the fix, and
nothing already recorded is lost: the earlier metrics, handle, lease and record stay as they were, and once space
is freed the lease is released and the run recorded.

Mounting needs root (CI runs the suite as root); where ``mount -t tmpfs`` is refused the tests fail, they do not
skip: a full disk that is never tried is no evidence.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from autodl import cli, pipeline
from autodl.catalog import load_catalog
from autodl.errors import LaunchError, StoreError
from autodl.launch.base import LaunchRequest
from autodl.launch.local import LocalLauncher
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.types import RunMetrics, RunRecord

pytestmark = pytest.mark.integration

SIZE = "512k"


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs at ``tmp_path/small`` (unmounted afterwards)."""
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0755", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a {SIZE} tmpfs at {where} ({done.stderr.strip() or done.returncode}): these "
                    "tests need root and mount(8); run them where both are given (CI runs as root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    """Write a filler file in ``folder`` until the disk says ENOSPC; :returns: the filler (delete it to free space)."""
    filler = folder / f"filler-{uuid.uuid4().hex[:6]}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        (folder / "probe").write_bytes(b"x" * 8192)
    assert full.value.errno == errno.ENOSPC
    return filler


def test_metrics_on_a_full_disk_keep_the_earlier_file_and_say_so(small_disk):
    folder = small_disk / "run"
    folder.mkdir()
    first = RunMetrics(source="process", duration_s=1.0, exit_code=None, steps=3)
    assert pipeline.keep_metrics(folder, first, print)
    fill(small_disk)
    said: list[str] = []
    later = RunMetrics(source="process", duration_s=2.0, exit_code=0, steps=6, notes=["x" * 200_000])
    assert pipeline.keep_metrics(folder, later, said.append) is False
    assert "No space left on device" in said[0] and "released all the same" in said[0]
    assert json.loads((folder / "metrics.json").read_text())["steps"] == 3  # the earlier file, whole
    assert not list(folder.glob(".metrics.json.*"))  # no temporary file left behind


def test_a_full_store_disk_is_autodls_error_and_the_lease_is_released_once_space_is_freed(small_disk, monkeypatch, capsys):
    monkeypatch.setenv("AUTODL_STORE_URL", f"sqlite:///{small_disk / 'autodl.db'}")
    ledger, records = Ledger(), RecordStore()
    ledger.book("dag.train.full", ["GPU-full"], model="A100-SXM4-40GB")
    records.write(RunRecord(run_key="dag.train.earlier", script="t.py", outcome="succeeded", declared_pool=True,
                            metrics={"steps": 3}))
    filler = fill(small_disk)
    with pytest.raises(StoreError, match="full") as exc:
        records.write(RunRecord(run_key="dag.train.big", script="t.py", outcome="succeeded",
                                declared_pool=True, metrics={"notes": ["y" * 4000] * 400}))
    assert exc.value.exit_code == 9 and "free space" in str(exc.value)
    assert cli.main(["leases", "--release", "dag.train.full", "--force"]) == 9  # autodl's store error
    err = capsys.readouterr().err
    assert "disk holding it is full; free space there" in err and "Traceback" not in err, err
    assert ledger.get("dag.train.full") is not None  # not half-released: still there to release
    filler.unlink()
    assert cli.main(["leases", "--release", "dag.train.full", "--force"]) == 0
    assert ledger.get("dag.train.full") is None
    assert records.get("dag.train.full").outcome == "not_started"  # released by hand before any launch: recorded
    assert records.get("dag.train.earlier").metrics["steps"] == 3  # what was recorded before is all there


def test_a_launch_into_a_full_autodl_home_is_a_launch_error_and_keeps_the_earlier_attempt(small_disk, monkeypatch, tmp_path):
    monkeypatch.setenv("AUTODL_HOME", str(small_disk))
    monkeypatch.setenv("AUTODL_LOCAL_ISOLATION", "none")
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    req = LaunchRequest(run_key="dag.train.home", script=str(script), on_cpu=True, vendor=load_catalog().vendor("nvidia"))
    launcher = LocalLauncher()
    first = launcher.launch(req)
    while launcher.poll(first) is None:
        pass
    handle_file = Path(first.log_path).parent / "handle.json"
    kept = handle_file.read_text()
    fill(small_disk)
    with pytest.raises(LaunchError, match="No space left on device") as exc:
        launcher.launch(req)
    assert "free space" in str(exc.value) and str(small_disk) in str(exc.value)
    assert handle_file.read_text() == kept  # the earlier attempt's handle, whole
    assert launcher.poll(first) == 0


def test_a_full_output_folder_fails_the_training_with_its_own_error_and_the_record_says_so(small_disk, tmp_path, monkeypatch):
    """The checkpoint the training saves into its full output folder fails in the training (its own error, its
    exit code); autodl records that, elsewhere, whole."""
    monkeypatch.setenv("AUTODL_LOCAL_ISOLATION", "none")
    fill(small_disk)
    script = tmp_path / "save.py"
    script.write_text("import os\nopen(os.path.join(os.environ['AUTODL_OUTPUT_DIR'], 'ckpt'), 'wb').write(b'w' * 65536)\n")
    req = LaunchRequest(run_key="dag.train.out", script=str(script), on_cpu=True, vendor=load_catalog().vendor("nvidia"),
                        env={"AUTODL_OUTPUT_DIR": str(small_disk)})
    launcher = LocalLauncher()
    handle = launcher.launch(req)
    while (code := launcher.poll(handle)) is None:
        pass
    assert code == 1
    log = launcher.read_logs(handle)[0]
    assert "No space left on device" in log and "OSError" in log  # the training's own traceback: the user's error
    assert os.path.exists(handle.log_path)
