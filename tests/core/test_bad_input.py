"""The fuzzer's minimal inputs (issue 13, tests/cases/bad-input/README.md) through the CLI, each with its right behaviour.

Seen: of 1,654 generated specs, pool files and scripts, 81 ended in a Python traceback, 15 hung and 45 were
wrongly accepted. Each case here runs ``autodl.cli.main`` as a user runs it (``autodl plan SPEC --pool
pool4.yaml --no-probe``, ``autodl profile SCRIPT --no-probe``, ``autodl inventory --pool POOL``) and checks
the documented exit code, a message naming the file and the field or line, and no traceback. The hang and
memory cases of the static analysis (``s_nested_loop.py``, ``s_bigpow.py``, ...) are tests/sandbox/'s.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

CASES = Path(__file__).resolve().parents[1] / "cases" / "bad-input"


@pytest.fixture
def cases(tmp_path, monkeypatch):
    """A copy of the case folder as the current folder (the specs name their scripts relatively)."""
    folder = tmp_path / "cases"
    shutil.copytree(CASES, folder)
    monkeypatch.chdir(folder)
    monkeypatch.delenv("AUTODL_DEBUG", raising=False)
    return folder


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``autodl ARGV`` in this process; never a traceback nor autodl's 'internal error'."""
    code, out, err = run_cli(capsys, *argv)
    assert "Traceback" not in out + err and "internal error" not in err, err
    return code, out, err


def plan(capsys, spec: str, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "plan", spec, "--pool", "pool4.yaml", "--no-probe", *extra)


# (file, exit code, what the message must say) -- what was seen is in each id
SPEC_CASES = [
    pytest.param("spec_bigint.yaml", ["spec_bigint.yaml:1", "task.batch_size_per_gpu", "too large"],
                 id="bigint-4301-digits-was-ValueError-traceback"),
    pytest.param("spec_badtag.yaml", ["spec_badtag.yaml:1", "task.batch_size_per_gpu", "'x' is not an integer"],
                 id="int-tag-on-x-was-traceback"),
    pytest.param("spec_deep.yaml", ["spec_deep.yaml:1", "nesting depth"], id="1000-nested-lists-was-RecursionError"),
    pytest.param("spec_binary.yaml", ["spec_binary.yaml", "binary"], id="binary-was-UnicodeDecodeError"),
    pytest.param("spec_shm_inf.yaml", ["spec_shm_inf.yaml:2", "launcher.shm_size", "not a finite number"],
                 id="shm-inf-was-OverflowError"),
    pytest.param("spec_cpus_inf.yaml", ["spec_cpus_inf.yaml:2", "launcher.cpus", "not a finite number"],
                 id="cpus-inf-was-traceback-in-renderers"),
    pytest.param("spec_hugebatch.yaml", ["spec_hugebatch.yaml:1", "task.batch_size_per_gpu", "too large"],
                 id="batch-10e400-was-OverflowError"),
    pytest.param("spec_hugebatch_cnn.yaml", ["spec_hugebatch_cnn.yaml:1", "task.batch_size_per_gpu", "too large"],
                 id="batch-10e400-cnn-was-OverflowError"),
    pytest.param("spec_laughs9.yaml", ["spec_laughs9.yaml", "more than 200,000 values"],
                 id="billion-laughs-was-a-hang"),
    pytest.param("spec_root_user.yaml", ["spec_root_user.yaml", "launcher.user", "uid 0"],
                 id="user-0-1000-was-accepted-as-root"),
    pytest.param("spec_mount_varrun.yaml", ["spec_mount_varrun.yaml", "launcher.mounts.0.source", "socket"],
                 id="mount-var-run-was-accepted"),
    pytest.param("spec_tag_true.yaml", ["spec_tag_true.yaml", "resource_policy.tag_priorities.domestic", "number"],
                 id="tag-priority-true-was-accepted"),
    pytest.param("spec_tag_nan.yaml", ["spec_tag_nan.yaml:2", "resource_policy.tag_priorities.domestic",
                                       "not a finite number"], id="tag-priority-nan-was-printed-as-NaN"),
    pytest.param("spec_dupkey.yaml", ["spec_dupkey.yaml:2", "duplicate key 'task'", "line 1"],
                 id="duplicate-key-was-silently-the-last"),
]


@pytest.mark.parametrize("spec, says", SPEC_CASES)
def test_bad_spec_is_a_spec_error_naming_file_and_field(cases, capsys, spec, says):
    code, out, err = plan(capsys, spec, "--json")
    assert code == 2, err
    assert out == ""
    for text in says:
        assert text in err, (text, err)
    assert len(err) < 600  # short: a message never expands a structure


def test_billion_laughs_message_does_not_expand_the_structure(cases, capsys):
    """The hang was the error message printing 9**9 'lol's; now the loader stops after 200,000 values."""
    code, _, err = plan(capsys, "spec_laughs9.yaml")
    assert code == 2 and "lol" not in err


@pytest.mark.parametrize("user", ["0:1000", "00", "root:1000", "-0", "0", "root", "000:0", "+0", "\uff10",
                                  " 0", "0 ", "4294967295", "1000:root"])
def test_root_in_any_spelling_is_refused(cases, capsys, user):
    Path("spec_user.yaml").write_text(f"task: {{script: model.py, input_shape: [32]}}\n"
                                      f"launcher: {{type: docker, user: {json.dumps(user)}}}\n")
    code, _, err = plan(capsys, "spec_user.yaml")
    assert code == 2 and "launcher.user" in err


@pytest.mark.parametrize("launcher", ["docker", "kubernetes"])
def test_numeric_non_root_user_renders_and_the_pod_is_never_uid_0(cases, capsys, launcher):
    Path("spec_user.yaml").write_text(f"task: {{script: model.py, input_shape: [32]}}\n"
                                      f"launcher: {{type: {launcher}, user: '01000:1000'}}\n")
    code, out, err = plan(capsys, "spec_user.yaml", "--json")
    assert code == 0, err
    launch = json.loads(out)["launch"]
    if launcher == "docker":
        assert launch["create_kwargs"]["user"] == "1000:1000"
    else:
        context = launch["pod"]["spec"]["securityContext"]
        assert context["runAsUser"] == 1000 and context["runAsNonRoot"] is True


@pytest.mark.parametrize("source", ["/var/run", "/run", "/", "/var/run/docker.sock/.", "/var", "//var//run/",
                                    "/var/lib/../run", "/run/docker.sock", "/var/run/docker.sock",
                                    "/run/containerd/containerd.sock", "/home/x/docker.sock"])
def test_mounts_that_hold_the_engine_socket_are_refused(cases, capsys, source):
    Path("spec_mount.yaml").write_text("task: {script: model.py, input_shape: [32]}\n"
                                       f"launcher: {{type: docker, mounts: [{{source: {json.dumps(source)}, target: /s}}]}}\n")
    code, _, err = plan(capsys, "spec_mount.yaml")
    assert code == 2 and "launcher.mounts.0.source" in err


def test_a_data_folder_mount_is_fine(cases, capsys):
    Path("spec_mount.yaml").write_text("task: {script: model.py, input_shape: [32]}\n"
                                       "launcher: {type: docker, mounts: [{source: /data/sets, target: /data}]}\n")
    code, out, err = plan(capsys, "spec_mount.yaml", "--json")
    assert code == 0, err
    assert json.loads(out)["launch"]["create_kwargs"]["volumes"]["/data/sets"]["bind"] == "/data"


@pytest.mark.parametrize("pool, says", [
    ("pool_binary.yaml", ["pool_binary.yaml", "binary"]),                                   # was UnicodeDecodeError
    ("pool_index_true.yaml", ["pool_index_true.yaml", "devices.0.index", "integer"]),      # was taken as 1
    ("pool_mem_true.yaml", ["pool_mem_true.yaml", "devices.0.memory_total_bytes", "integer"]),  # was taken as 1
])
def test_bad_pool_file_is_an_inventory_error(cases, capsys, pool, says):
    code, _, err = run(capsys, "inventory", "--pool", pool)
    assert code == 5
    for text in says:
        assert text in err


def test_bad_pool_file_in_plan_too(cases, capsys):
    code, _, err = run(capsys, "plan", "spec_tag_nan.yaml".replace("spec_tag_nan", "spec_min"), "--pool",
                       "pool_index_true.yaml", "--no-probe")
    assert code == 5 and "devices.0.index" in err


def test_huge_linear_is_not_accepted_as_zero_params(cases, capsys):
    """``model = nn.Linear(1000000, 1000000)`` at module level was "0 params, fits in 1.38 GiB": the dry run sees
    the 3.6 TiB weight requested in one allocation (more than its whole limit), so the estimate is raised by it and
    nothing in a pool of A100s can hold it (exit 4 with advice). Unmeasured (--no-probe) its size is unknown, never
    zero: the conservative bound."""
    code, out, err = run(capsys, "profile", "s_huge_linear.py", "--json")
    assert code == 0, err
    profile = json.loads(out)
    assert profile["peak_memory_bytes"] > 3 * 2**40
    assert [f for f in profile["findings"] if f["code"] == "dry-run-allocation"]
    code, out, err = run(capsys, "plan", "spec_min.yaml", "--pool", "pool4.yaml", "--json")
    assert code == 4 and json.loads(out)["fits"] is False
    code, out, err = run(capsys, "profile", "s_huge_linear.py", "--no-probe", "--json")
    assert code == 0 and json.loads(out)["params"] is None


@pytest.mark.parametrize("source, line", [
    ("return 5\n", 1),
    ("import paddle\n\ndef f(a, a):\n    return a\n", 3),
    ("def f():\n    nonlocal x\n", 2),
    ("x = 1\nbreak\n", 2),
    ("def g():\n    yield 1\n    return 2\nyield 3\n", 4),
])
def test_scripts_python_would_not_compile_are_profile_errors(cases, capsys, source, line):
    """``s_return_outside.py`` (and ``def f(a, a)``, a bad ``nonlocal``) were accepted; Python refuses them."""
    Path("bad.py").write_text(source)
    code, _, err = run(capsys, "profile", "bad.py", "--no-probe")
    assert code == 3 and f"bad.py:{line}: syntax error" in err


def test_s_return_outside(cases, capsys):
    code, _, err = run(capsys, "profile", "s_return_outside.py", "--no-probe")
    assert code == 3 and "s_return_outside.py:1" in err and "'return' outside function" in err


def test_s_addchain_python_cannot_compile_either(cases, capsys):
    """100,000 ``1 + 1 + ...``: was a RecursionError/MemoryError traceback in parsing; Python's own compiler
    refuses it too, so it is a profile error."""
    code, _, err = run(capsys, "profile", "s_addchain.py", "--no-probe")
    assert code == 3 and "s_addchain.py" in err and "too deeply" in err


def test_s_unary_is_valid_python_so_a_warning_not_an_error(cases, capsys):
    """``x = ----...1`` (1,000 signs) was a RecursionError traceback; Python runs it, so the static analysis
    says it could not follow it (a warning) and the profile goes on."""
    code, out, err = run(capsys, "profile", "s_unary.py", "--no-probe", "--json")
    assert code == 0, err
    findings = json.loads(out)["findings"]
    assert any(f["code"] == "analysis-too-deep" and f["severity"] == "warning" for f in findings)


def test_s_global_str_is_an_error_naming_the_line(cases, capsys):
    """``nn.Linear('a', 2)`` reached through a ``global`` was a ValueError traceback; Paddle itself refuses
    it in the dry run, so it is an error finding on line 8 (unmeasured, the text is not read for it)."""
    code, out, _ = run(capsys, "profile", "s_global_str.py", "--json")
    assert code == 3
    errors = [f for f in json.loads(out)["findings"] if f["severity"] == "error"]
    assert errors and errors[0]["line"] == 8 and errors[0]["code"] == "script-error"
    code, out, _ = run(capsys, "profile", "s_global_str.py", "--no-probe", "--json")
    assert code == 0 and json.loads(out)["params"] is None


def test_empty_script_profiles_with_warnings(cases, capsys):
    code, out, err = run(capsys, "profile", "s_empty.py", "--no-probe", "--json")
    assert code == 0, err
    assert any(f["code"] == "cold-start" for f in json.loads(out)["findings"])


def test_symlink_loop_as_script_spec_and_pool(cases, capsys):
    """``loop_a.py`` -> ``loop_b.py`` -> ``loop_a.py`` was a RuntimeError traceback."""
    for name in ("loop_a.py", "loop_b.py"):
        Path(name).unlink()
    os.symlink("loop_b.py", "loop_a.py")
    os.symlink("loop_a.py", "loop_b.py")
    code, _, err = run(capsys, "profile", "loop_a.py", "--no-probe")
    assert code == 2 and "loop_a.py" in err and "symlink loop" in err
    Path("spec_loop.yaml").write_text("task: {script: loop_a.py}\n")
    code, _, err = plan(capsys, "spec_loop.yaml")
    assert code == 2 and "task.script" in err and "symlink loop" in err
    code, _, err = plan(capsys, "loop_b.py")
    assert code == 2 and "symlink loop" in err
    code, _, err = run(capsys, "inventory", "--pool", "loop_a.py")
    assert code == 5 and "symlink loop" in err


def test_a_300_character_file_name(cases, capsys):
    """A 300-character script name was an OSError traceback."""
    name = "a" * 300 + ".py"
    code, _, err = run(capsys, "profile", name, "--no-probe")
    assert code == 2 and "too long" in err and len(err) < 600
    code, _, err = plan(capsys, "b" * 300 + ".yaml")
    assert code == 2 and "too long" in err
    Path("spec_long.yaml").write_text(f"task: {{script: {name}}}\n")
    code, _, err = plan(capsys, "spec_long.yaml")
    assert code == 2 and "task.script" in err and "too long" in err


def test_a_folder_or_a_fifo_is_refused_not_read(cases, capsys):
    os.mkfifo("fifo.yaml")
    code, _, err = plan(capsys, "fifo.yaml")  # reading a FIFO would block forever
    assert code == 2 and "not a regular file" in err
    code, _, err = run(capsys, "inventory", "--pool", ".")
    assert code == 5 and "folder" in err


def test_json_output_is_strict_json(cases, capsys):
    """``tag_priorities: {domestic: .nan}`` printed ``NaN`` into ``--json``; now no spec can, and the printer
    itself writes a number that is not finite as null."""
    from autodl.cli import _print_json

    _print_json({"score": float("nan"), "terms": [float("inf"), -float("inf"), 1.5]})
    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == {
        "score": None, "terms": [None, None, 1.5]}
