"""Log-following benchmark: bytes fetched per byte of log, for a real Docker container and a fake 1-hour pod log.

Run from the repository root (needs a Docker engine for the first row; ``--no-docker`` skips it)::

    .venv/bin/python benchmarks/log_follow.py

Each follower polls once a (simulated, for the pod) second, as the collect step does, and restarts a
few times (a fresh launcher resuming at the offset it kept, as after a triggerer restart). "log bytes"
is one full read of the finished log in the form the follower asks for it (with the engine's
timestamps); "fetched" is what the follower received. "before" is the former follower, which read the
whole log at every poll (quadratic). Every line must arrive exactly once: the script fails otherwise.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO)]

from autodl.launch.kubernetes import KubernetesLauncher  # noqa: E402
from autodl.types import LaunchHandle  # noqa: E402

LINE_BYTES = 100
"""Bytes per log line, newline included (the issue's example: a 1-hour run at 100 B/s)."""


BUSYBOX_IMAGE = "autodl-test-busybox:1"
"""The container image of the Docker row (built as the integration tests build it, when missing)."""


def rfc3339(ns: int) -> str:
    seconds, frac = divmod(ns, 10**9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac:09d}Z"


class FakePodLog:
    """A pod log that grows one line per simulated second; ``follow`` requests stream it as it grows."""

    def __init__(self, t0_s: int):
        self.t0_s = t0_s
        self.lines: list[tuple[int, bytes]] = []
        self.ended = False
        self.cond = threading.Condition()
        self.phase = "Running"

    def write(self, i: int) -> None:
        body = f"step {i} ".encode().ljust(LINE_BYTES - 1, b".") + b"\n"
        with self.cond:
            self.lines.append(((self.t0_s + i) * 10**9 + 123, body))
            self.cond.notify_all()

    def end(self) -> None:
        with self.cond:
            self.ended, self.phase = True, "Succeeded"
            self.cond.notify_all()

    def full(self) -> bytes:
        return b"".join(f"{rfc3339(ts)} ".encode() + body for ts, body in self.lines)

    # the CoreV1Api methods the launcher calls
    def read_namespaced_pod(self, name, namespace):
        return SimpleNamespace(status=SimpleNamespace(phase=self.phase))

    def read_namespaced_pod_log(self, name, namespace, container=None, follow=False, timestamps=False,
                                since_seconds=None, _preload_content=True):
        since_ns = (int(time.time()) - since_seconds) * 10**9 if since_seconds else 0
        return FakeResponse(self, since_ns)


class FakeResponse:
    def __init__(self, log: FakePodLog, since_ns: int):
        self.log, self.since_ns, self.closed = log, since_ns, False

    def stream(self, amt=None, decode_content=True):
        i = 0
        while True:
            with self.log.cond:
                while i >= len(self.log.lines) and not self.log.ended and not self.closed:
                    self.log.cond.wait()
                if self.closed or (i >= len(self.log.lines) and self.log.ended):
                    return
                ts, body = self.log.lines[i]
            i += 1
            if ts >= self.since_ns:
                yield f"{rfc3339(ts)} ".encode() + body

    def close(self):
        with self.log.cond:
            self.closed = True
            self.log.cond.notify_all()


def fetched(launcher) -> int:
    return sum(s.fetched_bytes for s in launcher._streams.values())


def drain(launcher, handle, offset: int, want_lines: int, got: list[str]) -> int:
    """Read until ``want_lines`` lines arrived in all (the stream delivers from its own thread)."""
    while sum(t.count("\n") for t in got) < want_lines:
        text, offset = launcher.read_logs(handle, offset)
        got.append(text)
        if not text:
            time.sleep(0.001)
    return offset


def pod_row(seconds: int = 3600, restarts: int = 5) -> dict:
    t0 = int(time.time()) - seconds - 2  # the simulated hour ends now: since_seconds is relative to the clock
    log = FakePodLog(t0)
    handle = LaunchHandle(launcher="kubernetes", run_key="bench", pod_name="bench-pod", namespace="default")
    launcher, total, offset, got, before, size = KubernetesLauncher(api=log), 0, 0, [], 0, 0
    every = seconds // (restarts + 1)
    for i in range(seconds):
        log.write(i)
        size += len(rfc3339(log.lines[-1][0])) + 1 + len(log.lines[-1][1])
        before += size  # the former follower: the whole log, every poll
        offset = drain(launcher, handle, offset, i + 1, got)
        if i and i % every == 0:  # a triggerer restart: a fresh launcher resumes at the kept offset
            total += fetched(launcher)
            launcher.close_logs(handle)
            launcher = KubernetesLauncher(api=log)
    log.end()
    text, offset = launcher.read_logs(handle, offset)
    got.append(text)
    total += fetched(launcher)
    launcher.close_logs(handle)
    expected = "".join(body.decode() for _ts, body in log.lines)
    if "".join(got) != expected:
        raise SystemExit("fake pod: the followed log differs from the log (a line lost or repeated)")
    size = len(log.full())
    return {"source": f"fake pod log, {seconds} s at {LINE_BYTES} B/s, {restarts} restarts", "log": size,
            "fetched": total, "before": before / size}


def docker_row(seconds: int = 30, per_s: int = 10) -> dict:
    import docker

    from autodl.launch.docker import DockerLauncher

    client = docker.from_env()
    try:
        client.images.get(BUSYBOX_IMAGE)
    except docker.errors.ImageNotFound:  # the tests' image: Debian's busybox-static, `docker import`ed
        import subprocess

        from tests.integration.conftest import _rootfs_tar

        subprocess.run(["docker", "import", "--change", "ENV PATH=/bin", "-", BUSYBOX_IMAGE], input=_rootfs_tar(),
                       check=True, capture_output=True)
    script = (f"i=0; while [ $i -lt {seconds * per_s} ]; do printf 'step %-{LINE_BYTES - 7}s\\n' $i; "
              f"i=$((i+1)); sleep {1 / per_s}; done")
    container = client.containers.run(BUSYBOX_IMAGE, ["sh", "-c", script], detach=True,
                                      network_mode="none", name=f"autodl-bench-{uuid.uuid4().hex[:8]}")
    handle = LaunchHandle(launcher="docker", run_key="bench", container_id=container.id, container_name=container.name)
    launcher, total, offset, got, before, polls = DockerLauncher(client=client), 0, 0, [], 0, 0
    try:
        while True:
            container.reload()
            running = container.status == "running"
            text, offset = launcher.read_logs(handle, offset)
            got.append(text)
            before += len(container.logs(stdout=True, stderr=True))
            polls += 1
            if not running:
                break
            if polls % 10 == 0:  # a restart every 10 polls
                total += fetched(launcher)
                launcher.close_logs(handle)
                launcher = DockerLauncher(client=client)
            time.sleep(1.0)
        text, offset = launcher.read_logs(handle, offset)
        got.append(text)
        total += fetched(launcher)
        launcher.close_logs(handle)
        plain = container.logs(stdout=True, stderr=True).decode()
        size = len(container.logs(stdout=True, stderr=True, timestamps=True))
    finally:
        container.remove(force=True)
    if "".join(got) != plain:
        raise SystemExit("docker: the followed log differs from the container's log (a line lost or repeated)")
    return {"source": f"docker (real dockerd), {seconds} s at {LINE_BYTES * per_s} B/s, {polls // 10} restarts",
            "log": size, "fetched": total, "before": before / len(plain.encode())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docker", action="store_true", help="skip the real-dockerd row")
    args = parser.parse_args()
    rows = [] if args.no_docker else [docker_row()]
    rows.append(pod_row())
    print(f"{'source':58} {'log bytes':>10} {'fetched':>10} {'ratio':>6} {'before':>8}")
    for r in rows:
        print(f"{r['source']:58} {r['log']:>10} {r['fetched']:>10} {r['fetched'] / r['log']:>6.3f} "
              f"{r['before']:>8.1f}")
    print("ratio = fetched / log bytes (target <= 1.1); before = the former follower's ratio (the whole log at every poll)")


if __name__ == "__main__":
    main()
