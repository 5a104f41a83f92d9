"""A real Airflow for the tests: api-server, scheduler (LocalExecutor), dag-processor and triggerer started as
separate processes on 127.0.0.1, with their own AIRFLOW_HOME (SQLite metadata), and driven through the REST API
the way the UI does (``/auth/token`` for a JWT, then ``/api/v2``).

Each component runs in its own process group, so a test can kill one (``kill -9``) and start it again;
:meth:`RealAirflow.stop` ends every process it started, and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
PORTS = range(28080, 28100)
"""The ports these tests may use (one is taken for the API server)."""


def free_port() -> int:
    import socket

    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1} for the Airflow API server")


class RealAirflow:
    """One Airflow installation in ``home``.

    :param bundles: DAG folders (name -> path), each a LocalDagBundle.
    :param env: extra environment for every component (e.g. ``AUTODL_LEASE_TTL``).
    """

    def __init__(self, home: Path, bundles: dict[str, Path], env: dict[str, str] | None = None):
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.password = "autodl-test-admin"
        (home / "plugins").mkdir(parents=True, exist_ok=True)  # autodl registers through its entry point only
        (home / "passwords.json").write_text(json.dumps({"admin": self.password}))
        venv_bin = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
            "PYTHONDONTWRITEBYTECODE": "1",
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "6",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": "autodl-real-airflow-test-secret",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
                {"name": name, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                 "kwargs": {"path": str(path), "refresh_interval": 5}} for name, path in bundles.items()
            ]),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AUTODL_HOME": str(home / "autodl"),
            "AUTODL_STORE_URL": f"sqlite:///{home / 'autodl.db'}",
            "AUTODL_USER": "tester",
            **(env or {}),
        }
        (home / "dags").mkdir(exist_ok=True)
        self._token: str | None = None

    # --------------------------------------------------------------------------------------- processes
    def start(self) -> "RealAirflow":
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for name in COMPONENTS:
            self.start_component(name)
        self.wait_ready()
        return self

    def start_component(self, name: str) -> subprocess.Popen:
        args = [name] + (["--port", str(self.port), "--host", "127.0.0.1"] if name == "api-server" else [])
        log = open(self.home / f"{name}.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "airflow", *args], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = proc
        return proc

    def kill_component(self, name: str) -> None:
        """``kill -9`` of the component's whole process group (the component and what it forked)."""
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def stop(self) -> None:
        """SIGTERM every component's process group, SIGKILL what is left after a grace period."""
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        self.procs.clear()

    def logs(self, name: str, tail: int = 4000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {proc.returncode}:\n{self.logs(name)}")

    def wait_ready(self, patience_s: float = 300) -> None:
        """Until the API server answers and the triggerer and scheduler have reported in (a bounded wait:
        a component that never comes up fails the test with its log instead of hanging it)."""
        deadline = time.monotonic() + patience_s
        while True:
            self._check_alive()
            try:
                health = httpx.get(f"{self.url}/api/v2/monitor/health", timeout=10).json()
                if all((health.get(k) or {}).get("status") == "healthy" for k in ("metadatabase", "scheduler", "triggerer")):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("Airflow did not come up:\n" + "\n".join(f"--- {n}\n{self.logs(n)}" for n in self.procs))
            time.sleep(2)

    # -------------------------------------------------------------------------------------------- REST
    def token(self) -> str:
        if self._token is None:
            r = httpx.post(f"{self.url}/auth/token", json={"username": "admin", "password": self.password}, timeout=30)
            r.raise_for_status()
            self._token = r.json()["access_token"]
        return self._token

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        r = httpx.request(method, f"{self.url}/api/v2{path}", headers={"Authorization": f"Bearer {self.token()}"},
                          timeout=60, **kwargs)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:2000]}")
        return r.json() if r.content else None

    def wait_for_dag(self, dag_id: str, patience_s: float = 300) -> None:
        """Until the DAG is parsed (and unpaused); its import error, if any, fails at once."""
        deadline = time.monotonic() + patience_s
        while True:
            self._check_alive()
            try:
                self.api("GET", f"/dags/{dag_id}")
                self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
                return
            except RuntimeError as exc:
                if "404" not in str(exc):
                    raise
            errors = self.api("GET", "/importErrors").get("import_errors", [])
            if errors:
                raise RuntimeError(f"DAG import errors: {errors}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"DAG {dag_id} was not parsed:\n{self.logs('dag-processor')}")
            time.sleep(2)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        run = self.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        tis = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti for ti in tis}

    def wait_for_runs(self, dag_id: str, run_ids: list[str], patience_s: float) -> dict[str, str]:
        """Until every run has ended (success or failed); ``patience_s`` is derived by the caller from the
        DAG's own limits (its spec's timeouts), so a broken Airflow fails the test instead of hanging it."""
        deadline = time.monotonic() + patience_s
        states: dict[str, str] = {}
        while True:
            self._check_alive()
            states = {r: self.run_state(dag_id, r) for r in run_ids}
            if all(s in ("success", "failed") for s in states.values()):
                return states
            if time.monotonic() > deadline:
                raise RuntimeError(f"runs of {dag_id} did not end: {states}\n--- scheduler\n{self.logs('scheduler')}"
                                   f"\n--- triggerer\n{self.logs('triggerer')}")
            time.sleep(3)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        r = httpx.get(f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                      headers={"Authorization": f"Bearer {self.token()}", "Accept": "application/json"},
                      params={"full_content": "true"}, timeout=60)
        if r.status_code >= 400:
            return f"<log unavailable: {r.status_code}>"
        content = r.json().get("content")
        if isinstance(content, list):
            return "\n".join(str(c.get("event", c)) if isinstance(c, dict) else str(c) for c in content)
        return str(content)
