"""bubblewrap inside an unprivileged container, on the real Docker engine: it cannot make the profiler's sandbox
under Docker's defaults (issue 17: the stack's dry run fell back to static analysis), and it can with the options
docker/compose.sandbox.yaml gives the profiling services. The image holds this machine's bwrap and its libraries
(``docker import``, no registry)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import require_service

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
IMAGE = "autodl-test-bwrap:1"
# the namespaces and the fresh /proc autodl.sandbox asks for (its _namespace_args), on the image's own root
BWRAP = ["/usr/bin/bwrap", "--unshare-user", "--uid", "1000", "--gid", "1000", "--unshare-pid", "--unshare-net",
         "--unshare-ipc", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "/bin/true"]


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return [w for line in out.splitlines() for w in line.split() if w.startswith("/")]


@pytest.fixture(scope="module")
def bwrap_image(docker_client):
    bwrap = shutil.which("bwrap")
    require_service(bwrap is not None, "bubblewrap", "run `source .ci/bubblewrap.sh`")
    true = shutil.which("true")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("proc", "dev", "tmp", "etc"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for path in {bwrap, true, *_libraries(bwrap), *_libraries(true)}:
            arcname = "usr/bin/bwrap" if path == bwrap else "bin/true" if path == true else path.lstrip("/")
            tar.add(str(Path(path).resolve()), arcname=arcname)
    docker_client.images.client.api.import_image_from_data(buf.getvalue(), repository=IMAGE.split(":")[0],
                                                           tag=IMAGE.split(":")[1])
    return IMAGE


def _run(client, security_opt: list[str]) -> tuple[int, str]:
    """Run BWRAP as uid 50000 (the stack's user) with ``security_opt`` as compose gives it; like the Docker CLI,
    ``systempaths=unconfined`` becomes empty MaskedPaths and ReadonlyPaths (the engine refuses it as such)."""
    api = client.api
    opts = [o for o in security_opt if o != "systempaths=unconfined"]
    host_config = api.create_host_config(network_mode="none", security_opt=opts or None)
    if "systempaths=unconfined" in security_opt:
        host_config["MaskedPaths"], host_config["ReadonlyPaths"] = [], []
    container = api.create_container(IMAGE, BWRAP, user="50000", host_config=host_config)
    try:
        api.start(container)
        code = api.wait(container, timeout=120)["StatusCode"]
        return code, api.logs(container).decode(errors="replace")
    finally:
        api.remove_container(container, force=True)


def test_bwrap_cannot_make_the_sandbox_in_a_default_container(docker_client, bwrap_image):
    code, out = _run(docker_client, [])
    assert code != 0, "Docker's defaults allowed the sandbox: docs/compose.md and the override are out of date"
    assert "namespace" in out or "proc" in out, out


def test_bwrap_makes_the_sandbox_with_the_overrides_options(docker_client, bwrap_image):
    override = yaml.safe_load((REPO / "docker/compose.sandbox.yaml").read_text())
    options = override["services"]["airflow-worker"]["security_opt"]
    code, out = _run(docker_client, options)
    assert code == 0, out
    for one in options:  # each is needed
        code, out = _run(docker_client, [o for o in options if o != one])
        assert code != 0, f"{one} is not needed: {out}"


# ------------------------------------------------------------- what Debian's docker-compose does with the override
def _compose_tool() -> str:
    tool = shutil.which("docker-compose")
    require_service(tool is not None, "docker-compose", "install Debian's docker-compose (`source .ci/compose.sh`)")
    return tool


def _rendered_security_opt(tool: str) -> list[str]:
    """``security_opt`` of ``airflow-worker`` as ``docker-compose config`` renders the stack with the override."""
    out = subprocess.run([tool, "--env-file", str(REPO / ".env.example"), "-f", str(REPO / "docker-compose.yaml"), "-f", str(REPO / "docker/compose.sandbox.yaml"),
                          "config"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)["services"]["airflow-worker"]["security_opt"]


def _compose_up(tool: str, folder: Path, project: str, security_opt: list[str]) -> subprocess.CompletedProcess:
    """``docker-compose up --no-start`` of one service running BWRAP as uid 50000 with ``security_opt``."""
    file = folder / f"{project}.yaml"
    file.write_text(yaml.safe_dump({"version": "3.8", "services": {"profiler": {
        "image": IMAGE, "command": BWRAP, "user": "50000", "network_mode": "none", "security_opt": security_opt}}}))
    return subprocess.run([tool, "-p", project, "-f", str(file), "up", "--no-start"], capture_output=True, text=True)


def _down(tool: str, folder: Path, project: str) -> None:
    subprocess.run([tool, "-p", project, "-f", str(folder / f"{project}.yaml"), "down"], capture_output=True)


def test_debian_compose_renders_the_override_and_the_engine_refuses_systempaths(docker_client, bwrap_image, tmp_path):
    """What docs/compose.md says was verified: Debian's docker-compose (Compose v1) renders the override's
    ``security_opt`` as written and sends it to the engine as it is; the engine refuses ``systempaths=unconfined``
    (only the Docker CLI and Compose v2 since docker/compose#10110 turn it into empty MaskedPaths/ReadonlyPaths),
    so with Compose v1 the override's services are not created at all."""
    tool = _compose_tool()
    rendered = _rendered_security_opt(tool)
    assert rendered == ["seccomp=unconfined", "systempaths=unconfined"]
    project = f"autodltest{tmp_path.name[-6:].lower().replace('_', '')}"
    try:
        out = _compose_up(tool, tmp_path, project, rendered)
        assert out.returncode != 0
        assert 'invalid --security-opt 2: "systempaths=unconfined"' in out.stderr, out.stderr
        assert docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"}) == []
    finally:
        _down(tool, tmp_path, project)


def test_with_compose_v1_seccomp_reaches_the_container_but_proc_stays_masked(docker_client, bwrap_image, tmp_path):
    """Without ``systempaths=unconfined`` Compose v1 creates the container: ``seccomp=unconfined`` reaches its
    HostConfig, the masked /proc paths stay, and bubblewrap cannot mount its /proc there."""
    tool = _compose_tool()
    project = f"autodltestv1{tmp_path.name[-6:].lower().replace('_', '')}"
    try:
        out = _compose_up(tool, tmp_path, project, ["seccomp=unconfined"])
        assert out.returncode == 0, out.stderr
        (container,) = docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"})
        host_config = container.attrs["HostConfig"]
        assert host_config["SecurityOpt"] == ["seccomp=unconfined"]
        assert "/proc/kcore" in (host_config.get("MaskedPaths") or []), host_config.get("MaskedPaths")
        container.start()
        assert container.wait(timeout=120)["StatusCode"] != 0
        assert "proc" in container.logs().decode(errors="replace")
    finally:
        _down(tool, tmp_path, project)
