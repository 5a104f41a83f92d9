"""The dry run's container, as it is asked of the engine (issue 17, item 5): every bound in the create call, the
code as a copy in a volume (no path of the worker bound: the engine may be another machine's), autodl's files
root's and read-only, and an environment with nothing of the worker's. No engine needed."""

from __future__ import annotations

import io
import json
import tarfile

from autodl.profile.container import (BUNDLE_DIR, OUT_DIR, WORK_DIR, DockerVenue, bundle_files, bundle_tar,
                                      container_config, container_env)
from autodl.profile.dryrun import CHILD, DryRunConfig
from autodl.sandbox import SandboxLimits
from autodl.spec import parse_spec

LIMITS = SandboxLimits(timeout_s=150, memory_bytes=12 << 30, max_processes=256, disk_bytes=1 << 30)


def _venue(**launcher):
    spec = parse_spec({"launcher": {"type": "docker", "image": "registry.example.com/train:3", **launcher}})
    return DockerVenue(spec.launcher)


def test_the_container_is_asked_with_every_bound():
    kw = _venue(mounts=[{"source": "/data/imagenet", "target": "/data", "read_only": False}]).create_kwargs(
        "autodl-dryrun-0123", LIMITS, {"A": "1"}, {"autodl.dry_run": "true"})
    assert kw["network_mode"] == "none" and kw["read_only"] is True
    assert kw["cap_drop"] == ["ALL"] and kw["security_opt"] == ["no-new-privileges"]
    assert kw["user"] == "1000:1000"
    assert kw["mem_limit"] == kw["memswap_limit"] == 12 << 30 and kw["pids_limit"] == 256
    assert "device_requests" not in kw and "devices" not in kw and "runtime" not in kw  # CPU only
    assert set(kw["tmpfs"]) == {WORK_DIR, OUT_DIR, "/tmp"} and all("size=" in v for v in kw["tmpfs"].values())
    # the code is the volume put_archive filled, read-only; the spec's mounts are read-only too, whatever they say
    assert kw["volumes"] == {"autodl-dryrun-0123": {"bind": BUNDLE_DIR, "mode": "ro"},
                             "/data/imagenet": {"bind": "/data", "mode": "ro"}}
    assert kw["command"][0] == "python" and kw["command"][1].startswith(BUNDLE_DIR)


def test_the_environment_has_nothing_of_the_workers(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-secret")
    monkeypatch.setenv("PATH", "/worker/bin:/usr/bin")
    env = container_env(64, {"HF_HOME": "/data/hf"})
    assert "worker-secret" not in json.dumps(env) and "PATH" not in env  # the image's own PATH stays
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["AUTODL_BATCH_SIZE_PER_GPU"] == "64" and env["HF_HOME"] == "/data/hf"
    assert env["AUTODL_OUTPUT_DIR"].startswith(WORK_DIR) and env["HOME"] == WORK_DIR


def test_the_bundle_is_roots_and_read_only_and_holds_the_staged_code(tmp_path):
    code = tmp_path / "code"
    (code / "conf").mkdir(parents=True)
    (code / "train.py").write_text("print(1)\n")
    (code / "conf" / "a.yaml").write_text("x: 1\n")
    (code / "link").symlink_to("/etc/passwd")  # stage_tree never makes one; the tar would not carry it either
    script = code / "train.py"
    cfg = container_config(script, DryRunConfig(script=str(script), argv=["--x"]), code=f"{BUNDLE_DIR}/code",
                           limits=LIMITS, user_dirs=[WORK_DIR])
    with tarfile.open(fileobj=io.BytesIO(bundle_tar(bundle_files(cfg), code))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        inner = json.loads(tar.extractfile("dryrun.json").read())
    package = {f"child/dryrun_child/{p.name}" for p in CHILD.glob("*.py")}
    assert {"code/train.py", "code/conf/a.yaml", "child/dryrun_child/__main__.py", "child/_container_entry.py",
            "child/_flops.py", "dryrun.json"} <= set(members) and "code/link" not in members
    # exactly the child's files: its package's modules (no __pycache__), the entry and the FLOPs counter
    files = {m for m, info in members.items() if m.startswith("child/") and info.isfile()}
    assert files == {"child/_container_entry.py", "child/_flops.py", *package}
    assert members["child/dryrun_child"].isdir()
    assert all(m.uid == 0 and m.gid == 0 for m in members.values())
    assert all(m.mode == 0o444 for m in members.values() if m.isfile())
    assert inner["script"] == f"{WORK_DIR}/train.py" and inner["result"] == f"{OUT_DIR}/result.json"
    assert inner["container"]["timeout_s"] == 150 and inner["argv"] == ["--x"]
