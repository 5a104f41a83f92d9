"""Runs never share a folder or a training, and a training never gets autodl's secrets (issue 13, parts 4-5).

Seen: two run keys that differ only in characters the run folder name replaced (or share their first 200
characters) shared a folder, so one run "reattached" to, and later stopped, another's training; after a
training exited 0 on its own, ``autodl leases --release`` recorded it as failed; the local launcher handed
the worker's whole environment (the store URL with its password included) to the training.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from autodl import pipeline
from autodl.catalog import load_catalog
from autodl.errors import LaunchError
from autodl.launch import LaunchRequest
from autodl.launch.local import RUN_KEY_FILE, LocalLauncher, run_dir_name, training_environment
from autodl.ledger import Ledger
from autodl.records import RecordStore
from autodl.store import RunState
from autodl.types import LaunchHandle, MemoryBreakdown, ResourceProfile

COLLIDING = [
    ("dag.group.manual__2026-01-01T00:00:00+00:00", "dag.group.manual__2026-01-01T00_00_00_00_00"),
    ("dag/a b", "dag_a_b"),
    ("x" * 200 + ".run1", "x" * 200 + ".run2"),
    ("dag.grp.r\u00e9", "dag.grp.r_"),
]


@pytest.mark.parametrize("a, b", COLLIDING)
def test_run_keys_the_old_folder_name_merged_get_their_own_folders(a, b):
    assert run_dir_name(a) != run_dir_name(b)
    launcher = LocalLauncher()
    fa, fb = launcher.run_dir(a), launcher.run_dir(b)
    assert fa != fb
    assert (fa / RUN_KEY_FILE).read_text() == a and (fb / RUN_KEY_FILE).read_text() == b
    assert len(fa.name.encode()) <= 81 and fa.name.startswith(a[:5].replace("/", "_"))
    assert pipeline.state_dir(a) == fa


def test_run_folder_name_is_stable_and_readable():
    assert run_dir_name("dag.group.run1") == run_dir_name("dag.group.run1")
    assert run_dir_name("dag.group.run1").startswith("dag.group.run1-")
    for key in ("../../etc", "/", "", ".", "a/../../b"):
        name = run_dir_name(key)
        assert "/" not in name and not name.startswith(".") and name not in ("", ".", "..")


def request(tmp_path: Path, run_key: str, body: str = "import time\ntime.sleep(60)\n", **kw) -> LaunchRequest:
    script = tmp_path / f"train_{run_dir_name(run_key)}.py"
    script.write_text(body)
    return LaunchRequest(run_key=run_key, script=str(script), on_cpu=True, vendor=load_catalog().vendor("nvidia"),
                         labels={"lease_id": "L1"}, **kw)


def wait(launcher, handle, timeout=60):
    deadline = time.monotonic() + timeout
    while (code := launcher.poll(handle)) is None:
        assert time.monotonic() < deadline, "training did not end"
        time.sleep(0.05)
    return code


@pytest.mark.parametrize("a, b", COLLIDING[:3])
def test_a_second_run_never_reattaches_to_or_stops_the_first(tmp_path, a, b):
    launcher = LocalLauncher()
    first = launcher.launch(request(tmp_path, a))
    try:
        second = launcher.launch(request(tmp_path, b, body="print('b')\n"))
        assert not second.reattached and second.pid != first.pid
        assert wait(launcher, second) == 0
        launcher.stop(second)
        assert launcher.poll(first) is None, "stopping b stopped a's training"
    finally:
        launcher.stop(first)


def test_a_folder_holding_another_run_key_is_refused(tmp_path):
    launcher = LocalLauncher()
    folder = launcher.run_dir("dag.g.r1")
    (folder / RUN_KEY_FILE).write_text("dag.g.OTHER")
    with pytest.raises(LaunchError, match="belongs to run 'dag.g.OTHER'"):
        launcher.launch(request(tmp_path, "dag.g.r1"))
    with pytest.raises(LaunchError, match="belongs to run"):
        pipeline.state_dir("dag.g.r1")


def test_a_handle_of_another_run_in_the_folder_is_not_reattached(tmp_path):
    launcher = LocalLauncher()
    other = launcher.launch(request(tmp_path, "dag.g.other"))
    try:
        folder = launcher.run_dir("dag.g.mine")
        (folder / "handle.json").write_text(json.dumps(other.to_json()))
        with pytest.raises(LaunchError, match="refusing to reattach"):
            launcher.launch(request(tmp_path, "dag.g.mine"))
        assert launcher.poll(other) is None
    finally:
        launcher.stop(other)


def profile_out(tmp_path, body):
    script = tmp_path / "train.py"
    script.write_text(body)
    b = MemoryBreakdown(weights_bytes=1000, gradients_bytes=1000, optimizer_state_bytes=1000, activations_bytes=2**20)
    p = ResourceProfile(script=str(script), params=250, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8, activation_bytes_per_sample=2**17, num_gpus=1)
    return {"profile": p.to_json(), "spec_path": None, "script": str(script)}


def test_release_never_stops_a_training_of_another_run_key(tmp_path):
    ctx_a = pipeline.RunContext(run_key="dag.g.a")
    out = profile_out(tmp_path, "import time\ntime.sleep(60)\n")
    sel = pipeline.step_select(ctx_a, out, log=lambda _l: None)
    handle_a = pipeline.step_launch(ctx_a, out, sel, log=lambda _l: None)
    try:
        ctx_b = pipeline.RunContext(run_key="dag.g.b")
        RunState().put(ctx_b.run_key, RunState.HANDLE, handle_a)  # a stale handle of another run under b's key
        logs: list[str] = []
        pipeline.step_release_and_record(ctx_b, script=None, spec_path=None, profile_out=None, selection=None,
                                         handle_json=None, metrics_json=None, log=logs.append)
        assert any("another run" in line for line in logs)
        assert LocalLauncher().poll(LaunchHandle.model_validate(handle_a)) is None
    finally:
        LocalLauncher().stop(LaunchHandle.model_validate(handle_a))


def test_manual_release_after_the_training_exited_0_records_succeeded(tmp_path):
    """The Airflow process died while collect followed the training; the training then finished on its own
    (exit 0). `autodl leases --release` must record what the launcher says: succeeded."""
    ctx = pipeline.RunContext(run_key="dag.g.done")
    out = profile_out(tmp_path, "print('trained')\n")
    sel = pipeline.step_select(ctx, out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx, out, sel, log=lambda _l: None)
    assert wait(LocalLauncher(), LaunchHandle.model_validate(handle)) == 0
    result = pipeline.release_by_hand(ctx.run_key, force=True, log=lambda _l: None)  # an ownerless lease: --force
    assert result["outcome"] == "succeeded" and Ledger().leases() == []
    record = RecordStore().get(ctx.run_key)
    assert record.outcome == "succeeded" and record.metrics["exit_code"] == 0


def test_manual_release_after_the_training_failed_on_its_own_records_its_exit_code(tmp_path):
    ctx = pipeline.RunContext(run_key="dag.g.bad")
    out = profile_out(tmp_path, "import sys\nsys.exit(3)\n")
    sel = pipeline.step_select(ctx, out, log=lambda _l: None)
    handle = pipeline.step_launch(ctx, out, sel, log=lambda _l: None)
    assert wait(LocalLauncher(), LaunchHandle.model_validate(handle)) == 3
    result = pipeline.release_by_hand(ctx.run_key, force=True, log=lambda _l: None)  # an ownerless lease: --force
    assert result["outcome"] == "failed" and RecordStore().get(ctx.run_key).metrics["exit_code"] == 3


# --------------------------------------------------------------------------------- environment
SECRETS = {
    "AUTODL_STORE_URL": "postgresql+psycopg2://autodl:sup3r-secret@db/autodl",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:airflow-secret@db/airflow",
    "AIRFLOW__CORE__FERNET_KEY": "fernet-secret",
    "AIRFLOW_CONN_MY_DB": "postgres://u:conn-secret@h/d",
    "DB_PASSWORD": "pw-secret", "GITHUB_TOKEN": "token-secret", "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "CUDA_API_KEY": "cuda-named-secret",
}
ALLOWED = {"FLAGS_cudnn_deterministic": "1", "NCCL_DEBUG": "INFO", "CUDA_HOME": "/usr/local/cuda",
           "LC_ALL": "C.UTF-8", "PADDLE_TRAINERS_NUM": "1", "OMP_NUM_THREADS": "2"}

ENV_DUMP = "import json, os\nprint(json.dumps(dict(os.environ)), flush=True)\n"


def test_the_training_gets_an_allow_listed_environment(tmp_path, monkeypatch):
    for k, v in {**SECRETS, **ALLOWED}.items():
        monkeypatch.setenv(k, v)
    launcher = LocalLauncher()
    req = request(tmp_path, "dag.g.env", body=ENV_DUMP, env={"AUTODL_BATCH_SIZE_PER_GPU": "64"},
                  options={"env": {"WANDB_MODE": "offline", "MY_OWN_TOKEN": "declared-by-the-spec"}})
    handle = launcher.launch(req)
    assert wait(launcher, handle) == 0
    text, _ = launcher.read_logs(handle)
    env = json.loads(text.splitlines()[0])
    for key in SECRETS:
        assert key not in env, key
    assert not any(v in text for v in SECRETS.values())
    for key, value in ALLOWED.items():
        assert env[key] == value
    assert env["PATH"] and env["AUTODL_RUN_KEY"] == "dag.g.env" and env["AUTODL_PADDLE_DEVICE"] == "cpu"
    assert env["AUTODL_BATCH_SIZE_PER_GPU"] == "64" and env["AUTODL_METRICS_FILE"].endswith(".steps.jsonl")
    assert env["AUTODL_LEASE_ID"] == "L1" and env["CUDA_VISIBLE_DEVICES"] == ""
    # what the spec itself declares (launcher.env) is the run's own: it is passed, and shown redacted
    assert env["WANDB_MODE"] == "offline" and env["MY_OWN_TOKEN"] == "declared-by-the-spec"
    assert launcher.render(req)["env"]["MY_OWN_TOKEN"] == "***"
    assert "declared-by-the-spec" not in launcher.render(req)["shell"]
    assert not any(k.startswith("AIRFLOW") for k in env)


def test_training_environment_rules():
    env = training_environment({"PATH": "/bin", "AUTODL_HOME": "/h", "AIRFLOW_HOME": "/a", "NCCL_SOCKET_IFNAME": "eth0",
                                "PADDLE_AUTH_TOKEN": "x", "HOME": "/root", "SSH_AUTH_SOCK": "/tmp/s"},
                               {"AUTODL_RUN_KEY": "r"})
    assert env == {"PATH": "/bin", "NCCL_SOCKET_IFNAME": "eth0", "HOME": "/root", "AUTODL_RUN_KEY": "r"}


@pytest.mark.parametrize("launcher_name", ["docker", "kubernetes"])
def test_container_launchers_pass_nothing_of_the_workers_environment(tmp_path, monkeypatch, launcher_name):
    """The Docker and Kubernetes launchers build the container's environment from the request and the spec only."""
    from autodl.launch import get_launcher

    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    req = LaunchRequest(run_key="dag.g.c", script=str(code / "train.py"), on_cpu=True,
                        vendor=load_catalog().vendor("nvidia"), options={"env": {"HF_TOKEN": "hf-secret"}})
    rendered = json.dumps(get_launcher(launcher_name).render(req))
    assert not any(v in rendered for v in SECRETS.values())
    assert "hf-secret" not in rendered  # the spec's own secret is passed to the container but never printed
    if launcher_name == "docker":
        from autodl.launch.docker import DockerLauncher

        plan = DockerLauncher().plan(req)
        assert plan.env["HF_TOKEN"] == "hf-secret" and not set(SECRETS) & set(plan.env)
    else:
        from autodl.launch.kubernetes import KubernetesLauncher

        pod = KubernetesLauncher(catalog=load_catalog()).build_pod(req)
        names = {e.name: e.value for e in pod.spec.containers[0].env}
        assert names["HF_TOKEN"] == "hf-secret" and not set(SECRETS) & set(names)


# ------------------------------------------------------------------------ container reattach checks
class FakeContainer:
    def __init__(self, cid, run_key, status="running"):
        self.id = self.name = cid
        self.labels = {"autodl.run_key": run_key, "autodl.managed": "true"}
        self.status = status
        self.attrs = {"Created": cid}
        self.removed = False

    def remove(self, force=False):
        self.removed = True

    def stop(self, timeout=None):
        self.status = "exited"


class FakeContainers:
    def __init__(self, items):
        self.items = items

    def list(self, all=False, filters=None):  # an engine whose label filter matches loosely (a prefix)
        wanted = filters["label"].split("=", 1)[1]
        return [c for c in self.items if c.labels["autodl.run_key"].startswith(wanted)]

    def get(self, cid):
        return next(c for c in self.items if c.id == cid)


class FakeClient:
    def __init__(self, items):
        self.containers = FakeContainers(items)


def test_docker_reattach_and_stop_check_the_whole_run_key(tmp_path):
    from autodl.launch.docker import DockerLauncher

    mine, other = FakeContainer("c1", "dag.g.r1"), FakeContainer("c2", "dag.g.r1-and-more")
    launcher = DockerLauncher(client=FakeClient([mine, other]))
    assert launcher.containers_of("dag.g.r1") == [mine]
    launcher.stop(LaunchHandle(launcher="docker", run_key="dag.g.r1", container_id="c1"))
    assert mine.removed and not other.removed


def test_kubernetes_reattach_checks_the_run_key_annotation(catalog):
    from kubernetes import client as k8s

    from autodl.launch.kubernetes import RUN_KEY_HASH_LABEL, KubernetesLauncher, run_key_hash

    def pod(name, run_key):
        return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name, labels={RUN_KEY_HASH_LABEL: run_key_hash("dag.g.r1")},
                                                   annotations={"autodl/run-key": run_key}),
                         status=k8s.V1PodStatus(phase="Running"))

    class Api:
        def list_namespaced_pod(self, namespace, label_selector=""):
            return k8s.V1PodList(items=[pod("mine", "dag.g.r1"), pod("collides", "dag.g.other")])

    launcher = KubernetesLauncher(api=Api(), catalog=catalog)
    assert [p.metadata.name for p in launcher.pods_of("dag.g.r1", "default")] == ["mine"]
