"""Extra Docker engines standing for GPU hosts: each its own ``dockerd`` with its own socket, data root,
exec root and pid file (``--bridge=none --iptables=false``), started here and stopped by pid.

The machine's default engine (``/var/run/docker.sock``) is never touched. Needs root (dockerd) and
Debian's docker.io (``.ci/docker.sh`` installs it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Engine:
    """One extra dockerd: ``name`` is the GPU host it stands for."""

    name: str
    root: Path
    process: subprocess.Popen | None = None

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def base_url(self) -> str:
        return f"unix://{self.socket}"

    def argv(self) -> list[str]:
        # short paths: containerd's socket lives under the exec root and unix socket paths are limited to 107 bytes
        return ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false",
                "--host", self.base_url, "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "x"),
                "--pidfile", str(self.root / "dockerd.pid"), *os.environ.get("AUTODL_DOCKERD_ARGS", "").split()]


def start(engines: list[Engine], wait_s: float = 90.0) -> None:
    """Start every engine and wait until each answers ``docker info``.

    :raises RuntimeError: an engine exited or did not answer within ``wait_s`` (its log's tail in the message).
    """
    for engine in engines:
        engine.root.mkdir(parents=True, exist_ok=True)
        log = open(engine.root / "dockerd.log", "ab")
        engine.process = subprocess.Popen(engine.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
    deadline = time.monotonic() + wait_s
    for engine in engines:
        while True:
            ok = subprocess.run(["docker", "-H", engine.base_url, "info"], capture_output=True).returncode == 0
            if ok:
                break
            if engine.process.poll() is not None or time.monotonic() > deadline:
                tail = (engine.root / "dockerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"dockerd for {engine.name} did not start (exit {engine.process.poll()}):\n{tail}")
            time.sleep(0.5)


def stop(engines: list[Engine]) -> None:
    """Stop the engines this module started (by their pid: SIGTERM, SIGKILL after 30 s) and delete their folders."""
    for engine in engines:
        proc = engine.process
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for engine in engines:
        for mount in reversed(_mounts_under(engine.root)):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(engine.root, ignore_errors=True)


def _mounts_under(root: Path) -> list[str]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [line.split()[1] for line in lines if line.split()[1].startswith(str(root) + "/")]
