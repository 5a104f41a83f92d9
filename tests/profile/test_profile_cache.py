"""The profile cache (issue 18, item 8): the same script content, folder, spec, environment, Paddle and autodl
versions reuse the last profile, kept in autodl's store (SQLite and PostgreSQL: several hosts share it); any change
profiles again. The next estimate is calibrated by the previous run's own measured peak and says so.

Profiles here are static (``probe=False``, milliseconds) unless marked ``slow``: what is cached does not depend on
the path that made it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import autodl
from autodl.profile import profile_script
from autodl.profile import cache as C
from autodl.records import RecordStore, calibrate_profile
from autodl.spec import parse_spec
from autodl.types import RunRecord
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the schema-per-test fixture

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture
def script(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(FIX / "simple_cnn.py", folder / "train.py")
    (folder / "config.json").write_text('{"lr": 0.1}')
    return folder / "train.py"


class Counting:
    """profile_script, counting the profiles actually made."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *a, **k):
        self.calls += 1
        return profile_script(*a, **k)


SPEC = {"task": {"batch_size_per_gpu": 32}, "launcher": {"env": {"IMG": "64"}}}


def _profile(fn, script, spec=SPEC, url=None, **kw):
    return C.cached(fn, url=url)(script, parse_spec(spec), probe=False, **kw)


def test_the_same_script_and_spec_reuse_the_stored_profile(script, store_url):
    fn = Counting()
    first = _profile(fn, script, url=store_url)
    second = _profile(fn, script, url=store_url)
    assert fn.calls == 1
    assert second.peak_memory_bytes == first.peak_memory_bytes and second.profile_key == first.profile_key
    (note,) = [f for f in second.findings if f.code == "profile-cache"]
    assert "is reused" in note.message and first.profile_key[:12] in note.message
    assert second.max_batch_size_by_device == first.max_batch_size_by_device


def test_another_host_reuses_what_one_host_profiled(script, store_url, monkeypatch):
    """The rows are in the store: a second worker (another process, another host name) finds them."""
    fn = Counting()
    monkeypatch.setattr(C.socket, "gethostname", lambda: "worker-a")
    _profile(fn, script, url=store_url)
    monkeypatch.setattr(C.socket, "gethostname", lambda: "worker-b")
    reused = _profile(fn, script, url=store_url)
    assert fn.calls == 1
    assert "on worker-a" in next(f.message for f in reused.findings if f.code == "profile-cache")


@pytest.mark.parametrize("change", ["script", "folder", "spec", "launcher.env", "environment", "paddle", "autodl"])
def test_any_change_it_rests_on_profiles_again(script, change, monkeypatch):
    fn = Counting()
    _profile(fn, script)
    spec = SPEC
    if change == "script":
        script.write_text(script.read_text() + "\n# a comment\n")
    elif change == "folder":
        (script.parent / "config.json").write_text('{"lr": 0.2}')
    elif change == "spec":
        spec = {**SPEC, "task": {"batch_size_per_gpu": 16}}
    elif change == "launcher.env":
        spec = {**SPEC, "launcher": {"env": {"IMG": "128"}}}
    elif change == "environment":
        monkeypatch.setenv("AUTODL_DRYRUN_TIMEOUT_S", "20")
    elif change == "paddle":
        monkeypatch.setattr(C, "_paddle_version", lambda: "paddlepaddle==9.9.9")
    else:
        monkeypatch.setattr(autodl, "__version__", "9.9.9")
    again = _profile(fn, script, spec)
    assert fn.calls == 2
    assert not any(f.code == "profile-cache" for f in again.findings)


def test_the_superseded_profile_of_the_same_script_and_spec_is_dropped(script):
    fn = Counting()
    _profile(fn, script)
    script.write_text(script.read_text() + "\n# changed\n")
    _profile(fn, script)
    _profile(fn, script, {"task": {"batch_size_per_gpu": 8}})  # another spec: kept beside it
    store = C.ProfileCache()
    with store._session() as s:
        assert s.query(C.ProfileCacheRow).count() == 2
    assert store.scripts() == [str(script.resolve())]
    assert store.clear(str(script)) == 2


def test_no_cache_profiles_again_and_replaces_it(script):
    fn = Counting()
    _profile(fn, script)
    fresh = _profile(fn, script, use_cache=False)
    assert fn.calls == 2 and not any(f.code == "profile-cache" for f in fresh.findings)


def test_a_dry_run_that_did_not_measure_is_not_kept(script):
    p = profile_script(script, parse_spec(SPEC), probe=False)
    assert C.cacheable(p, probe=False)
    assert not C.cacheable(p.model_copy(update={"method": "static"}), probe=None)  # the dry run failed: try again
    assert C.cacheable(p.model_copy(update={"method": "dry_run"}), probe=None)


def test_a_store_that_cannot_be_used_never_stops_a_profile(script):
    p = _profile(Counting(), script, url="sqlite:////no/such/folder/x.db")
    assert p.peak_memory_bytes > 0
    assert any(f.code == "profile-cache" and f.severity == "warning" for f in p.findings)


def test_the_folder_fingerprint_sees_what_the_dry_run_is_shown(script):
    before = C.folder_fingerprint(script)
    (script.parent / ".git").mkdir()
    (script.parent / ".git" / "HEAD").write_text("ref")
    (script.parent / "__pycache__").mkdir()
    assert C.folder_fingerprint(script) == before  # hidden entries are not shown to the dry run
    (script.parent / "model.py").write_text("x = 1\n")
    assert C.folder_fingerprint(script) != before


# ------------------------------------------------------------------------ calibration by the measured peak
def _record(profile, key: str, *, peak: int, outcome: str = "succeeded", declared: bool = False, batch=None):
    prof = profile.to_json() | {"batch_size": batch or profile.batch_size}
    RecordStore().write(RunRecord(run_key=key, script=profile.script, outcome=outcome, declared_pool=declared,
                                  profile=prof, estimated_peak_bytes=profile.peak_memory_bytes,
                                  actual_peak_bytes=peak, device_model="A100-SXM4-40GB"))


def test_the_previous_runs_higher_peak_raises_the_estimate_and_says_so(script):
    p = _profile(Counting(), script)
    _record(p, "dag.g.r1", peak=p.peak_memory_bytes + (1 << 30))
    got = calibrate_profile(p)
    assert got.peak_memory_bytes == p.peak_memory_bytes + (1 << 30)
    (w,) = [f for f in got.findings if f.code == "measured-calibration"]
    assert w.severity == "warning" and "dag.g.r1 on A100-SXM4-40GB" in w.message


def test_a_lower_measured_peak_is_said_and_the_estimate_kept(script):
    p = _profile(Counting(), script)
    _record(p, "dag.g.r1", peak=p.peak_memory_bytes // 2)
    got = calibrate_profile(p)
    assert got.peak_memory_bytes == p.peak_memory_bytes
    (i,) = [f for f in got.findings if f.code == "measured-calibration"]
    assert i.severity == "info" and "50%" in i.message


@pytest.mark.parametrize("other", ["changed script", "other batch", "declared pool", "failed"])
def test_only_the_same_profile_on_a_device_calibrates(script, other):
    p = _profile(Counting(), script)
    key = p.profile_key
    if other == "changed script":
        script.write_text(script.read_text() + "\n# changed\n")
        key = _profile(Counting(), script).profile_key
    _record(p.model_copy(update={"profile_key": key}), "dag.g.r1", peak=p.peak_memory_bytes * 2,
            batch=16 if other == "other batch" else None, declared=other == "declared pool",
            outcome="failed" if other == "failed" else "succeeded")
    got = calibrate_profile(p)
    assert got.peak_memory_bytes == p.peak_memory_bytes
    assert not any(f.code == "measured-calibration" for f in got.findings)


def test_the_dags_profile_step_reuses_the_cache(script, tmp_path):
    from autodl import pipeline

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"task:\n  script: {script}\n  batch_size_per_gpu: 32\n")
    _, first = pipeline.profile_run(None, spec, probe=False)
    _, second = pipeline.profile_run(None, spec, probe=False)
    assert first.profile_key and second.profile_key == first.profile_key
    assert any(f.code == "profile-cache" for f in second.findings)


def test_cli_no_cache_profiles_again(script, capsys):
    import json

    from autodl.cli import main

    assert main(["profile", str(script), "--no-probe", "--json"]) == 0
    capsys.readouterr()
    assert main(["profile", str(script), "--no-probe", "--json"]) == 0
    assert any(f["code"] == "profile-cache" for f in json.loads(capsys.readouterr().out)["findings"])
    assert main(["profile", str(script), "--no-probe", "--json", "--no-cache"]) == 0
    assert not any(f["code"] == "profile-cache" for f in json.loads(capsys.readouterr().out)["findings"])


def test_the_estimator_code_in_the_key_covers_the_dry_run_childs_package():
    """The dry-run child became the package autodl/profile/dryrun_child/ (issue 20): the key hashed only
    autodl/profile/*.py, so a fixed child would have served the old child's cached figures."""
    names = {p.relative_to(Path(C.__file__).parent).as_posix() for p in C.estimator_files()}
    assert {"dryrun.py", "dryrun_child/batch.py", "dryrun_child/__main__.py"} <= names


def test_a_reused_profile_names_the_estimator_code_it_rests_on(script, store_url):
    """A fresh user upgraded autodl and saw it profile again, while the note said only "autodl (0.1.0) unchanged"."""
    fn = Counting()
    _profile(fn, script, url=store_url)
    second = _profile(fn, script, url=store_url)
    (note,) = [f for f in second.findings if f.code == "profile-cache"]
    code = C._estimator_code()[:12]
    assert f"estimator code {code}" in note.message
