"""The real Airflow of the browser tests (:class:`tests.integration.browser.AirflowServer`: api-server,
scheduler with the LocalExecutor, dag-processor, triggerer on 127.0.0.1, its own AIRFLOW_HOME) with the DAG
folders and settings the queue and crash tests need, and the REST calls they make (``/auth/token`` for a JWT,
then ``/api/v2``, as the UI does).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.browser import AirflowServer, http_json

REPO = Path(__file__).resolve().parents[2]
PORTS = (28080, 28081, 28082, 28083)
"""The api-server's port, then the (unserved) log and health server ports: this task's range is 28080-28099.
Fixed, so :meth:`AirflowServer.start` fails at once when one is taken on 127.0.0.1 (a leftover Airflow of an earlier
run), naming the port, instead of the tests reaching that server."""


class RealAirflow(AirflowServer):
    """:class:`AirflowServer` with DAG bundles instead of ``dags/``, no plugins folder (autodl registers through
    its entry point), LocalExecutor parallelism 6, and ``env`` added (e.g. ``AUTODL_LEASE_TTL``).

    :param bundles: DAG folders (name -> path), each a LocalDagBundle refreshed every 5 s.
    """

    def __init__(self, home: Path, bundles: dict[str, Path], env: dict[str, str] | None = None,
                 ports: tuple[int, int, int, int] = PORTS):
        super().__init__(home=home, repo=REPO, ports=ports, autodl_home=home / "autodl")
        (home / "plugins").mkdir(exist_ok=True)
        self.env.update({
            "PYTHONDONTWRITEBYTECODE": "1",
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
            "AIRFLOW__CORE__PARALLELISM": "6",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
                {"name": name, "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                 "kwargs": {"path": str(path), "refresh_interval": 5}} for name, path in bundles.items()]),
            # a task whose worker was killed is found after 60 s instead of 300 s
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AUTODL_USER": "tester",
            **(env or {}),
        })
        self._token: str | None = None

    # ------------------------------------------------------------------------------------------ checks
    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"airflow {name} exited with {proc.returncode}:\n{self.component_log(name)}")

    def component_log(self, name: str, tail: int = 4000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def until(self, what: str, check, patience_s: float, every_s: float = 1.0) -> Any:
        """``check()`` until truthy; the components must stay up meanwhile. ``patience_s`` bounds the wait so that
        a broken Airflow fails the test (with the scheduler's log) instead of hanging it; nothing is timed."""
        deadline = time.monotonic() + patience_s
        while True:
            self.check_alive()
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not happen:\n--- scheduler\n{self.component_log('scheduler')}"
                                     f"\n--- triggerer\n{self.component_log('triggerer')}")
            time.sleep(every_s)

    # -------------------------------------------------------------------------------------------- REST
    def rest(self, path: str, *, method: str = "GET", body: Any = None) -> Any:
        if self._token is None:
            self._token = self.token()
        return http_json(f"{self.url}/api/v2{path}", method=method, body=body, token=self._token)

    def wait_for_dag(self, dag_id: str, patience_s: float = 300) -> None:
        """Until the DAG is parsed; then unpause it. A DAG import error fails at once."""
        def parsed() -> bool:
            try:
                self.rest(f"/dags/{urllib.parse.quote(dag_id)}")
                return True
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
            errors = self.rest("/importErrors").get("import_errors", [])
            if errors:
                raise AssertionError(f"DAG import errors: {errors}")
            return False

        self.until(f"DAG {dag_id} parsed", parsed, patience_s, every_s=2)
        self.rest(f"/dags/{dag_id}", method="PATCH", body={"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        return self.rest(f"/dags/{dag_id}/dagRuns", method="POST", body={"logical_date": None, "conf": conf or {}})["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.rest(f"/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}")["state"]

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        tis = self.rest(f"/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti for ti in tis}

    def wait_for_runs(self, dag_id: str, run_ids: list[str], patience_s: float) -> dict[str, str]:
        """Until every run has ended (success or failed); the caller derives ``patience_s`` from the DAG's own
        limits (its spec's timeouts)."""
        states: dict[str, str] = {}

        def ended() -> bool:
            states.update({r: self.run_state(dag_id, r) for r in run_ids})
            return all(s in ("success", "failed") for s in states.values())

        self.until(f"runs of {dag_id} ending", ended, patience_s, every_s=3)
        return states

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The task's log as the UI shows it (the trigger's lines included)."""
        path = f"/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
        content = self.rest(path).get("content")
        if isinstance(content, list):
            return "\n".join(str(c.get("event", c)) if isinstance(c, dict) else str(c) for c in content)
        return str(content)
