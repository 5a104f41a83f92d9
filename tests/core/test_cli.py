"""The autodl command as a user runs it: JSON documents, tables, exit codes and messages."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "include" / "specs" / "simple_cnn.yaml"
SCRIPT = REPO / "include" / "scripts" / "simple_cnn.py"


def test_profile_json_has_the_documented_keys(autodl):
    out = json.loads(autodl("profile", str(SCRIPT), "--spec", str(SPEC), "--json", "--no-probe").stdout)
    for key in ("params", "peak_memory_bytes", "breakdown", "flops_per_step", "num_gpus", "findings",
                "max_batch_size_by_device"):
        assert key in out
    # unmeasured (--no-probe): the conservative bound, the model's size unknown (null, never 0)
    assert out["params"] is None and out["method"] == "cold_start"
    assert out["batch_size"] == 64
    assert out["max_batch_size_by_device"] == {}
    assert out["peak_memory_bytes"] == sum(out["breakdown"].values())


def test_plan_json_ranks_the_demo_pool(autodl):
    out = json.loads(autodl("plan", str(SPEC), "--json", "--no-probe", "--pool", str(REPO / "include/pools/demo.yaml")).stdout)
    assert out["fits"] is True and out["declared_pool"] is True
    first = out["placements"][0]
    assert first["model"] == "A100-SXM4-40GB" and first["devices"] == ["GPU-demo0000-a100-0000-0000-000000000000"]
    assert first["score"] >= out["placements"][-1]["score"] and first["reasons"]
    assert any(d["model"] == "Ascend-910" for d in out["dropped"])
    # on the chosen device the run is pinned by UUID; the pool is declared, so here it runs on CPU
    assert out["launch"]["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-demo0000-a100-0000-0000-000000000000"
    assert out["launch_here"]["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "simple_cnn.py" in out["launch"]["shell"]


def test_plan_table_without_json(autodl):
    proc = autodl("plan", str(SPEC), "--no-probe")
    assert "A100-SXM4-40GB" in proc.stdout and "DECLARED" in proc.stdout and "dropped" in proc.stdout


def test_plan_shows_what_the_profile_warned_about(autodl, tmp_path):
    """A fresh user saw `autodl plan` book-ready output with no word of the profile's warnings (a hard-coded
    device, a guessed input): the plan rests on them, so its JSON carries the findings and its table the warnings."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.read_text().replace("import paddle\n", "import paddle\npaddle.set_device('gpu:1')\n", 1))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"task:\n  script: {script}\n")
    out = json.loads(autodl("plan", str(spec), "--json", "--no-probe").stdout)
    codes = {f["code"]: f for f in out["findings"]}
    assert "hardcoded-device" in codes and codes["hardcoded-device"]["severity"] == "warning"
    table = autodl("plan", str(spec), "--no-probe").stdout
    assert "profile findings" in table and "hardcoded-device" in table


def test_no_fit_exits_4_with_advice(autodl, tmp_path):
    spec = tmp_path / "huge.yaml"
    # 5,000,000 x 3 x 32 x 32 x 4 B: the input batch alone is 57 GiB, over 85% of the pool's largest card; the
    # model's size is unknown (no probe), so only such a certain floor refuses (autodl.policy.need)
    spec.write_text(f"task:\n  script: {SCRIPT}\n  input_shape: [3, 32, 32]\n  batch_size_per_gpu: 5000000\n")
    proc = autodl("plan", str(spec), "--json", "--no-probe", check=False)
    assert proc.returncode == 4
    out = json.loads(proc.stdout)
    assert out["fits"] is False and out["placements"] == [] and out["suggestions"]


def test_bad_spec_exits_2_naming_field(autodl, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("resource_policy:\n  memory_threshold: 1.7\n")
    proc = autodl("plan", str(spec), check=False)
    assert proc.returncode == 2
    assert "resource_policy.memory_threshold" in proc.stderr and str(spec) in proc.stderr


def test_profile_refuses_a_device_name_not_in_the_catalog_as_plan_does(autodl, tmp_path):
    """A fresh user's ``preferred_devices: [A100-40GB]`` (a typo of A100-SXM4-40GB): ``autodl plan`` refused it,
    ``autodl profile --spec`` exited 0 saying nothing, though the docs call such a typo an error."""
    spec = tmp_path / "pref.yaml"
    spec.write_text(f"task:\n  script: {SCRIPT}\nresource_policy:\n  preferred_devices: [A100-40GB]\n")
    proc = autodl("profile", "--spec", str(spec), "--no-probe", check=False)
    assert proc.returncode == 2
    assert "resource_policy.preferred_devices[0]: 'A100-40GB' is not in the GPU catalog" in proc.stderr
    assert "A100-SXM4-40GB" in proc.stderr


def test_profile_without_a_script_or_a_spec_says_to_give_the_script(autodl):
    proc = autodl("profile", check=False)
    assert proc.returncode == 2 and "no training script was given: `autodl profile SCRIPT" in proc.stderr
    assert "<spec>" not in proc.stderr


def test_a_spec_given_where_the_script_goes_is_read_as_the_spec(autodl, tmp_path):
    """``autodl plan SPEC`` takes the spec as its argument; ``autodl profile SPEC`` read the YAML as Python and said
    "syntax error near 'task:'; fix the script". The spec's task.script is the script, as for plan."""
    spec = tmp_path / "att.yaml"
    spec.write_text(f"task:\n  script: {SCRIPT}\n  batch_size_per_gpu: 48\n")
    out = json.loads(autodl("profile", str(spec), "--json", "--no-probe").stdout)
    assert out["batch_size"] == 48 and out["script"] == str(SCRIPT)
    proc = autodl("profile", str(spec), "--spec", str(SPEC), "--no-probe", check=False)
    assert proc.returncode == 2 and "is a task spec, not a training script" in proc.stderr
    assert "syntax error" not in proc.stderr


def test_missing_script_and_syntax_error(autodl, tmp_path):
    proc = autodl("profile", str(tmp_path / "none.py"), check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("import paddle\ndef f(:\n    pass\n")
    proc = autodl("profile", str(bad), "--no-probe", check=False)
    assert proc.returncode == 3 and "bad.py:2" in proc.stderr and "syntax error" in proc.stderr


def test_inventory_and_runs_and_leases_json(autodl):
    inv = json.loads(autodl("inventory", "--json", "--pool", str(REPO / "include/pools/demo.yaml")).stdout)
    assert len(inv["devices"]) == 4 and inv["leased"] == {}
    assert json.loads(autodl("runs", "--json").stdout) == []
    assert json.loads(autodl("leases", "--json").stdout) == []


def test_plan_text_shows_the_pod_for_kubernetes(autodl, tmp_path):
    spec = tmp_path / "k8s.yaml"
    spec.write_text(f"task:\n  script: {SCRIPT}\n  input_shape: [3, 32, 32]\nlauncher:\n  type: kubernetes\n  namespace: training\n")
    out = autodl("plan", str(spec), "--no-probe").stdout
    assert "create this pod in namespace training" in out
    assert "nvidia.com/gpu: '1'" in out and "nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB" in out


def test_leases_show_their_owner_and_only_the_owner_releases_without_force(autodl, monkeypatch):
    """Issue 13: `autodl leases --release` freed any run's lease (another tenant freed one whose training kept
    running). Another user's lease needs --force, and the refusal says whose it is."""
    from autodl.ledger import Ledger
    from autodl.types import LeaseOwner

    Ledger().book("dag.train.r1", ["GPU-0"], owner=LeaseOwner(dag_id="dag", run_id="r1", user="alice"))
    table = autodl("leases").stdout
    assert "dag.train.r1" in table and "alice" in table and re.search(r"in \d+ s", table)
    shown = json.loads(autodl("leases", "--json").stdout)[0]
    assert shown["owner"] == {"dag_id": "dag", "run_id": "r1", "user": "alice", "team": None} and shown["ttl_s"] == 300

    monkeypatch.setenv("AUTODL_USER", "bob")
    refused = autodl("leases", "--release", "dag.train.r1", check=False)
    assert refused.returncode == 6 and "Traceback" not in refused.stderr
    assert "not yours (bob)" in refused.stderr and "user alice, DAG dag, run r1" in refused.stderr
    assert "--force" in refused.stderr and Ledger().get("dag.train.r1") is not None
    done = autodl("leases", "--release", "dag.train.r1", "--force")
    assert re.search(r"released lease \w+ of run dag.train.r1 held on devices GPU-0; no training was launched on it",
                     done.stdout) and Ledger().leases() == []


def test_expired_leases_are_listed_and_reaped_and_the_queue_is_shown(autodl, monkeypatch):
    import time

    from autodl.ledger import Ledger
    from autodl.queue import AdmissionQueue

    Ledger().book("dag.train.old", ["GPU-0"], ttl_s=0.2)
    AdmissionQueue().join("dag.train.next", num_gpus=1, needed_bytes=2**30, candidates=[["GPU-0"]], stale_after_s=600,
                          owner_user="carol")
    time.sleep(0.3)
    assert "EXPIRED" in autodl("leases").stdout
    assert "reaped 1 expired lease(s): dag.train.old" in autodl("leases", "--reap").stdout
    assert Ledger().leases() == []
    queue = json.loads(autodl("queue", "--json").stdout)
    assert [(q["run_key"], q["owner_user"], q["stale"]) for q in queue] == [("dag.train.next", "carol", False)]
    assert "dag.train.next" in autodl("queue").stdout


def test_the_profile_table_of_an_unmeasured_model_says_its_states_are_unknown(autodl, tmp_path, monkeypatch):
    """A fresh user's --no-probe table said "weights GiB 0.00" and a 1.10 GiB peak per device while placement sized
    the run as the largest device (34 GiB): the model states were never measured, and the table now says so."""
    monkeypatch.setenv("COLUMNS", "200")
    script = tmp_path / "train.py"
    script.write_text("import paddle\n")
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in autodl("profile", str(script), "--no-probe").stdout.splitlines() if line.count("│") >= 3}
    for term in ("weights GiB", "gradients GiB", "optimizer state GiB"):
        assert rows[term] == "unknown (see the cold-start warning)", rows
    assert rows["peak memory GiB / device"].endswith("+ unknown model states: placed as the largest allowed device")


@pytest.mark.slow
@pytest.mark.parametrize("args", [("plan", str(SPEC), "--json", "--no-probe"),
                                  ("profile", str(SCRIPT), "--spec", str(SPEC), "--json", "--no-probe"),
                                  ("runs", "--json")], ids=["plan", "profile", "runs"])
def test_the_command_as_a_process_prints_what_main_prints_in_process(autodl, args, tmp_path, autodl_home):
    """The tests above call ``main`` in this process; ``python -m autodl.cli`` as a real process (a fresh
    interpreter: the module's own imports, the entry point's exit status) gives the same status and document.
    Its own home, so that neither run finds the other's cached profile; this process's environment otherwise (the
    plan's launch command quotes PYTHONPATH), the checkout's autodl installed (scripts/setup.sh: ``pip install -e``)."""
    home = tmp_path / "process_home"
    home.mkdir()
    real = subprocess.run([sys.executable, "-m", "autodl.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "AUTODL_HOME": str(home),
                               "AUTODL_STORE_URL": f"sqlite:///{home / 'autodl.db'}"})
    assert real.returncode == 0, real.stderr
    # the documents name their home's folders (the run's outputs): the same, but for that
    assert json.loads(real.stdout.replace(str(home), str(autodl_home))) == json.loads(autodl(*args).stdout)


def test_a_findings_text_in_square_brackets_is_printed_as_written(capsys):
    """Seen: the probe's "feeding inputs it made up (float32[b, 1, 128]; ...)" was printed "(float32; ...)": rich read
    "[b, 1, 128]" as a style tag and dropped it. Every table the CLI prints shows data, never markup."""
    from autodl import cli
    from autodl.types import Finding

    message = "feeding inputs it made up (float32[b, 1, 128]; int64[b, 64]) to [bold]layer[/bold] 'head'"
    cli._print_findings(cli._console(), [Finding(severity="warning", code="probe-shape-mismatch", message=message)])
    out = " ".join(capsys.readouterr().out.split())
    assert "float32[b, 1, 128]; int64[b, 64]" in out and "[bold]layer[/bold]" in out, out


def test_the_profile_table_tells_phases_of_one_name_apart_by_their_inputs():
    """A fresh user's GRU on variable-length batches read seven rows 'train phase tensor peak GiB (batch 16)' that
    could not be told apart; each now names its inputs' shape (a single phase of a name is shown as before)."""
    from rich.console import Console

    from autodl.cli import _profile_table
    from autodl.types import MemoryBreakdown, PhasePeak, ResourceProfile

    b = MemoryBreakdown(weights_bytes=1 << 20, gradients_bytes=1 << 20, optimizer_state_bytes=2 << 20,
                        activations_bytes=8 << 20)
    phases = [PhasePeak(name="train", batch_size=16, peak_bytes=(10 + n) << 20, input_shapes=[[n]],
                        input_dtypes=["int64"]) for n in (38, 24)]
    phases.append(PhasePeak(name="eval", batch_size=16, peak_bytes=5 << 20, input_shapes=[[38]], input_dtypes=["int64"]))
    profile = ResourceProfile(script="lm.py", params=1000, peak_memory_bytes=b.total_bytes, breakdown=b,
                              flops_per_step=1e9, batch_size=16, phases=phases)
    con = Console(width=200, record=True)
    con.print(_profile_table(profile))
    text = con.export_text()
    assert "train phase tensor peak GiB (batch 16, inputs 38)" in text
    assert "train phase tensor peak GiB (batch 16, inputs 24)" in text
    assert "eval phase tensor peak GiB (batch 16)" in text


def test_the_workspace_row_says_what_it_holds():
    """A fresh user saw 'workspace GiB 1.03' dominate a tiny model's figure with nothing saying what it is, and a
    parameter count that held BatchNorm's statistics with no word of what is trained."""
    from rich.console import Console

    from autodl.cli import _profile_table
    from autodl.types import MemoryBreakdown, ResourceProfile

    b = MemoryBreakdown(weights_bytes=1 << 20, workspace_bytes=600 << 20)
    profile = ResourceProfile(script="cnn.py", params=1096, trainable_params=1000, peak_memory_bytes=b.total_bytes,
                              breakdown=b, flops_per_step=1e9, batch_size=16,
                              workspace_terms_bytes={"cuda_context": 500 << 20, "cudnn_workspace": 100 << 20})
    con = Console(width=200, record=True)
    con.print(_profile_table(profile))
    text = con.export_text()
    assert "workspace GiB (CUDA context, cuDNN workspace)" in text
    assert "1,096 (1,000 trainable)" in text  # BatchNorm's statistics are parameters, not trained
