"""Real services for integration tests: under CI (CI=true) a missing service is a failure, not a skip.

Docker: ``docker_client`` needs an engine (``.ci/run`` sources ``.ci/docker.sh`` first);
``busybox_image`` builds a tiny image from Debian's busybox-static with ``docker import``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

BUSYBOX = Path("/bin/busybox")
IMAGE = "autodl-test-busybox:1"
"""Tag of the test image: Debian's busybox-static plus /tmp, /workspace and a non-root user, built
with ``docker import`` (no registry, no network)."""


def require_service(available: bool, what: str, how: str) -> None:
    """Fail under CI, skip with the reason elsewhere, when a real service is missing."""
    if available:
        return
    message = f"{what} is not available: {how}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _unavailable(reason: str) -> None:
    require_service(False, "Docker", f"{reason}; run `source .ci/docker.sh` (installs and starts dockerd)")


@pytest.fixture(scope="session")
def docker_client():
    """A ``docker.DockerClient`` to a live engine."""
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException as exc:
        _unavailable(f"no Docker engine answers ({exc})")
    yield client
    client.close()


def _rootfs_tar() -> bytes:
    """A root file system: /bin/busybox with one symlink per applet, /tmp, /workspace, /etc/passwd."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def folder(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def text(name: str, body: str) -> None:
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))

        for name in ("bin", "etc", "workspace", "dev", "proc", "sys"):
            folder(name)
        folder("tmp", 0o1777)
        tar.add(str(BUSYBOX), arcname="bin/busybox")
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
        for applet in applets:
            if applet == "busybox":
                continue
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nautodl:x:1000:1000:autodl:/tmp:/bin/sh\n")
        text("etc/group", "root:x:0:\nautodl:x:1000:\n")
    return buf.getvalue()


@pytest.fixture(scope="session")
def busybox_image(docker_client):
    """The test image's tag; built once per engine (``docker import`` of :func:`_rootfs_tar`)."""
    import docker

    try:
        docker_client.images.get(IMAGE)
        return IMAGE
    except docker.errors.ImageNotFound:
        pass
    if not BUSYBOX.is_file() or not shutil.which("docker"):
        _unavailable("/bin/busybox (Debian busybox-static) or the docker CLI is missing")
    subprocess.run(["docker", "import", "--change", "ENV PATH=/bin", "-", IMAGE], input=_rootfs_tar(),
                   check=True, capture_output=True)
    return IMAGE
