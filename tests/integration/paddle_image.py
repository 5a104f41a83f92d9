"""A Paddle-capable test image without a registry: the busybox root of ``conftest._rootfs_tar``, ``lib``/``lib64``
links and this machine's Python interpreter (its standard library, at the same path), run with the host's
``/usr`` and the virtualenv (Paddle CPU) mounted read-only."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile

IMAGE = "autodl-test-hostpython:2"
"""Tag of the image; the interpreter comes from the mounts of :func:`python_mounts`."""


def python_mounts() -> list[dict]:
    """``launcher.mounts`` entries that bring this interpreter, its libraries and the virtualenv (Paddle) in."""
    paths = dict.fromkeys(["/usr", sys.prefix])
    return [{"source": p, "target": p, "read_only": True} for p in paths]


def python_in_container() -> str:
    """The virtualenv's interpreter, at the same path inside the container."""
    return f"{sys.prefix}/bin/python"


def build(client) -> str:
    """Build :data:`IMAGE` once per engine (``docker import``) and return its tag."""
    import docker

    from tests.integration.conftest import _rootfs_tar

    try:
        client.images.get(IMAGE)
        return IMAGE
    except docker.errors.ImageNotFound:
        pass
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(_rootfs_tar())) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        for name, target in (("lib", "usr/lib"), ("lib64", "usr/lib64")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            dst.addfile(info)
        for name in ("usr", "root", "data"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            dst.addfile(info)
        skip = {"test", "site-packages", "__pycache__", "idlelib", "tkinter", "ensurepip", "include", "share"}
        dst.add(sys.base_prefix, arcname=sys.base_prefix.lstrip("/"),
                filter=lambda info: None if set(info.name.split("/")) & skip else info)
    subprocess.run(["docker", "import", "--change", "ENV PATH=/bin", "-", IMAGE], input=out.getvalue(),
                   check=True, capture_output=True)
    return IMAGE
