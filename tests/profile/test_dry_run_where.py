"""Where the dry run runs (issue 17, item 5): the worker's sandbox, the launcher's image, or nowhere -- decided
explicitly, said in the profile; and the report the container's entry hands back, read as untrusted."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from autodl.errors import ConfigError
from autodl.profile import _container_entry as entry
from autodl.profile import profile_script
from autodl.profile.container import child_output, decode_report
from autodl.profile.where import choose, configured
from autodl.spec import parse_spec

FIX = Path(__file__).parent / "fixtures"


def test_auto_runs_on_the_worker_where_paddle_and_the_sandbox_work():
    c = choose("auto", "docker", paddle_here=True, no_sandbox_why=None)
    assert c.venue == "worker" and "bubblewrap" in c.reason


@pytest.mark.parametrize("paddle, sandbox", [(False, None), (True, "bwrap: Can't mount proc on /newroot/proc")])
def test_auto_runs_in_the_launchers_image_where_the_worker_cannot(paddle, sandbox):
    """Seen (issue 17): in the compose stack's worker (no Paddle, no bubblewrap in a container) the dry run
    silently fell back to static analysis. Now it runs in the launcher's image and says why."""
    for launcher in ("docker", "kubernetes"):
        c = choose("auto", launcher, paddle_here=paddle, no_sandbox_why=sandbox)
        assert c.venue == launcher
        assert ("PaddlePaddle is not installed" if not paddle else "no sandbox") in c.reason
        assert "launcher's image" in c.reason


def test_forcing_either_venue_is_honoured():
    assert choose("launcher", "docker", paddle_here=True, no_sandbox_why=None).venue == "docker"
    assert choose("worker", "docker", paddle_here=False, no_sandbox_why=None).venue is None
    c = choose("launcher", "local", paddle_here=True, no_sandbox_why=None)
    assert c.venue is None and "no image" in c.reason


def test_a_bad_configured_venue_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv("AUTODL_DRY_RUN_IN", "container")
    with pytest.raises(ConfigError, match="AUTODL_DRY_RUN_IN.*auto, worker, launcher"):
        configured(None)
    assert configured("worker") == ("worker", "the spec's task.dry_run_in")
    monkeypatch.setenv("AUTODL_DRY_RUN_IN", "launcher")
    assert configured(None)[0] == "launcher"


def test_without_paddle_and_without_an_image_the_finding_says_the_bound_and_why(monkeypatch):
    import autodl.profile as prof

    monkeypatch.setattr(prof, "paddle_available", lambda: False)
    p = profile_script(FIX / "simple_cnn.py", parse_spec({"launcher": {"type": "local"}}))
    assert p.method == "cold_start" and p.params is None and p.dry_run_in is None
    (w,) = [f for f in p.findings if f.code == "paddle-unavailable"]
    assert "conservative bound" in w.message and "'local', which has no image" in w.message


def test_forcing_the_launcher_with_a_local_launcher_runs_nothing_and_says_so():
    p = profile_script(FIX / "simple_cnn.py", parse_spec({"task": {"dry_run_in": "launcher"}, "launcher": "local"}))
    assert p.method == "cold_start" and p.dry_run_in is None and p.dry_run_seconds is None
    (w,) = [f for f in p.findings if f.code == "dry-run-nowhere"]
    assert "conservative bound" in w.message and "dry_run_in is launcher" in w.message


def test_an_unreachable_engine_leaves_the_conservative_bound_with_the_engines_reason(monkeypatch):
    """The launcher's engine does not answer: nothing ran, the estimate is the conservative bound, the finding names the engine."""
    import autodl.profile as prof

    monkeypatch.setattr(prof, "paddle_available", lambda: False)
    spec = parse_spec({"launcher": {"type": "docker", "image": "autodl-none:0", "image_pull_policy": "Never"}})
    p = profile_script(FIX / "simple_cnn.py", spec, engine={"base_url": "tcp://127.0.0.1:9", "timeout": 2})
    assert p.method == "cold_start" and p.dry_run_in is None
    (w,) = [f for f in p.findings if f.code == "probe-unavailable"]
    assert "launcher's image" in w.message and "127.0.0.1:9" in w.message and "conservative bound" in w.message


# --------------------------------------------------------------------------- the entry's report, untrusted
def _frames(report: dict) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        entry.emit(report)
    return buf.getvalue()


def _report(result: bytes) -> dict:
    import base64

    return {"returncode": 0, "timed_out": False, "seconds": 1.5, "left_out": [],
            "files": {"result.json": {"data": base64.b64encode(result).decode(), "why": None},
                      "alloc_events.json": {"data": None, "why": "missing"}}}


def test_the_entrys_report_comes_back_whole_through_the_log():
    big = json.dumps({"steps": [], "notes": [os.urandom(30_000).hex()]}).encode()  # does not compress
    text = "a script's own line\n" + _frames(_report(big))
    assert text.count("@autodl-dryrun ") > 1  # chunked below Docker's 16 KiB line split
    rep = decode_report(text)
    assert rep is not None and rep.returncode == 0 and rep.files["result.json"] == big
    out = child_output(rep)
    assert out.result == big and out.events is None and out.refused is None


def test_a_torn_or_forged_report_is_not_believed():
    good = _frames(_report(b'{"steps": []}'))
    lines = good.splitlines()
    assert decode_report("\n".join(lines[:-1])) is None  # no end line: the container died first
    forged = lines[0][:-4] + "AAAA"
    assert decode_report("\n".join([forged, *lines[1:]])) is None  # checksum
    # a script printing its own frames before autodl's: the last complete, checksummed one wins
    fake = _frames(_report(b'{"params": 1}'))
    assert decode_report(fake + good).files["result.json"] == b'{"steps": []}'


def test_a_result_that_is_a_link_is_refused_with_why():
    rep = decode_report(_frames({"returncode": 0, "files": {"result.json": {"data": None, "why": "not a regular file"}}}))
    out = child_output(rep)
    assert out.result is None and "not a regular file" in out.refused


def test_a_package_only_the_image_has_sends_the_dry_run_to_the_image():
    from autodl.profile.where import image_retry

    worker = choose("auto", "docker", paddle_here=True, no_sandbox_why=None)
    missing = {"type": "ModuleNotFoundError", "message": "No module named 'paddlenlp'"}
    again = image_retry(worker, "docker", missing, "cannot-run")
    assert again is not None and again.venue == "docker" and "launcher's image" in again.reason
    assert image_retry(worker, "local", missing, "cannot-run") is None  # no image to try
    assert image_retry(worker, "docker", {"type": "FileNotFoundError"}, "cannot-run") is None  # data: not the image's
    forced = choose("worker", "docker", paddle_here=True, no_sandbox_why=None)
    assert image_retry(forced, "docker", missing, "cannot-run") is None  # forced to the worker: stays there
