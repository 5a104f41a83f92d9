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
