"""Headless Chromium driven over the DevTools protocol (``websocket-client``), and a real Airflow started from
its parts (api-server, scheduler, dag-processor, triggerer) for the browser tests.

Only 127.0.0.1 and the ports given are used; every process started here runs in its own process group and
is stopped by that group's id.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterable

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1440,1000", "--remote-debugging-address=127.0.0.1"]


def find_chromium() -> str | None:
    """Debian's ``chromium`` (``apt-get install chromium``), or another Chrome on PATH."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left after ``grace_s``."""
    if proc.poll() is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # children of a leader that already exited
        except ProcessLookupError:
            pass
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def http_json(url: str, *, method: str = "GET", body: Any = None, token: str | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def wait_until(check, what: str, *, within_s: float, every_s: float = 1.0) -> Any:
    """Call ``check`` until it returns something truthy; after ``within_s`` fail saying ``what`` never happened
    (a bound so that a broken service fails the test instead of hanging it; nothing is timed)."""
    deadline = time.monotonic() + within_s
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - retried until the bound
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within_s:.0f} s (last error: {last_error})")
        time.sleep(every_s)


class PortInUse(AssertionError):
    """A port the harness was given is taken on 127.0.0.1 (:func:`check_ports_free`)."""


def check_ports_free(ports: Iterable[int]) -> None:
    """Fail at once, naming the port, if any of ``ports`` cannot be bound on 127.0.0.1.

    Seen: a CI run killed mid-way left its Airflow listening on 127.0.0.1:28080; the next run's api-server
    failed to bind, and its tests talked to the leftover server, failing with "HTTP Error 401: Unauthorized".
    The probe binds as the servers do (``SO_REUSEADDR`` on, as uvicorn sets it), so a listener on the port is
    found, while the TIME_WAIT connections an Airflow that stopped cleanly leaves for a minute are not.
    """
    taken = []
    for port in ports:
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            taken.append(f"127.0.0.1:{port} is in use ({exc.strerror}): a leftover Airflow from an earlier run? "
                         f"`ss -ltnp 'sport = :{port}'` shows the process; stop it and rerun")
        finally:
            probe.close()
    if taken:
        raise PortInUse("; ".join(taken))


class Chromium:
    """One headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, binary: str, *, port: int, user_data_dir: Path, log_path: Path):
        import websocket  # websocket-client

        self.port = port
        log = open(log_path, "wb")
        self.proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--remote-debugging-port={port}",
                                      f"--user-data-dir={user_data_dir}", "about:blank"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            pages = wait_until(lambda: [t for t in http_json(f"http://127.0.0.1:{port}/json/list") if t["type"] == "page"],
                               "Chromium's DevTools endpoint", within_s=60, every_s=0.5)
            self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=120, suppress_origin=True)
        except BaseException:
            stop_group(self.proc)
            raise
        self._ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Runtime.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript error: {result['exceptionDetails'].get('text')} in {expression[:120]}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, what: str, *, within_s: float = 90) -> Any:
        return wait_until(lambda: self.eval(expression), what, within_s=within_s, every_s=0.5)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - the browser is stopped below anyway
            pass
        stop_group(self.proc, grace_s=5)


class AirflowServer:
    """A real Airflow 3 (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1 with its own home.

    :param ports: the api-server's port, then the ports set for the worker log server, the triggerer log
        server and the scheduler health server (none of them is started: the api-server reads task logs
        from this host's disk).
    """

    def __init__(self, *, home: Path, repo: Path, ports: tuple[int, int, int, int], autodl_home: Path,
                 password: str | None = None):
        self.home = home
        self.ports = ports
        self.port = ports[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.password = password or secrets.token_urlsafe(12)
        home.mkdir(parents=True, exist_ok=True)
        autodl_home.mkdir(parents=True, exist_ok=True)
        (home / "passwords.json").write_text(json.dumps({"admin": self.password}))
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AUTODL_"))},
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(repo / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(ports[1]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(ports[2]),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(ports[3]),
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            # this Airflow runs a triggerer: autodl's steps defer by default, as in the compose deployment
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            "AUTODL_HOME": str(autodl_home),
            "AUTODL_STORE_URL": f"sqlite:///{autodl_home / 'autodl.db'}",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }
        self.procs: dict[str, subprocess.Popen] = {}

    def component_args(self, name: str) -> list[str]:
        """The ``airflow`` arguments that start one component. The log servers would listen on every
        interface: the api-server reads the task logs from this host's disk instead."""
        return {"api-server": ["api-server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                "scheduler": ["scheduler", "--skip-serve-logs"], "dag-processor": ["dag-processor"],
                "triggerer": ["triggerer", "--skip-serve-logs"]}[name]

    def start_component(self, name: str) -> subprocess.Popen:
        """Start one component in its own process group, its output appended to ``<home>/<name>.log``."""
        log = open(self.home / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "airflow", *self.component_args(name)],
                                            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self.procs[name]

    def kill_component(self, name: str) -> None:
        """``kill -9`` of one component's whole process group (it and what it forked), as a crash would."""
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def start(self) -> None:
        """Migrate the metadata database, start the components and wait until they report healthy. A port
        already taken on 127.0.0.1 fails at once (:class:`PortInUse`), before anything is started: the tests
        would otherwise talk to whatever holds it."""
        check_ports_free(self.ports)
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for name in ("api-server", "scheduler", "dag-processor", "triggerer"):
            self.start_component(name)
        wait_until(self._healthy, "Airflow's api-server, scheduler, dag-processor and triggerer reporting healthy",
                   within_s=240, every_s=2)

    def _healthy(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"airflow {name} exited with {proc.returncode}; see {self.home / (name + '.log')}")
        health = http_json(f"{self.url}/api/v2/monitor/health")
        return all((health.get(part) or {}).get("status") == "healthy"
                   for part in ("metadatabase", "scheduler", "dag_processor", "triggerer"))

    def token(self) -> str:
        return http_json(f"{self.url}/auth/token", method="POST",
                         body={"username": "admin", "password": self.password})["access_token"]

    def api(self, path: str, *, method: str = "GET", body: Any = None) -> Any:
        return http_json(f"{self.url}/api/v2{path}", method=method, body=body, token=self.token())

    def stop(self) -> None:
        """Stop Airflow's processes, then any training a run left behind (its lease is released by hand,
        which stops the training: a training runs in its own process group, outside Airflow's)."""
        for proc in self.procs.values():
            stop_group(proc)
        autodl = [sys.executable, "-m", "autodl.cli"]
        try:
            out = subprocess.run([*autodl, "leases", "--json"], env=self.env, capture_output=True, text=True,
                                 timeout=120)
            for lease in json.loads(out.stdout or "[]"):
                subprocess.run([*autodl, "leases", "--release", lease["run_key"], "--force"], env=self.env, timeout=120,
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        except (ValueError, subprocess.SubprocessError, KeyError, TypeError):
            pass  # nothing more this harness can stop

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:] for p in self.home.glob("*.log"))
