"""GPU samples of a pod (and of a container whose host NVML cannot be read from here) from a real Prometheus server
(Debian's ``prometheus``) on 127.0.0.1 scraping two stand-in dcgm-exporters that serve dcgm-exporter's text format
with its Kubernetes-mode labels (``pod``, ``namespace``, ``container``): issue 17, pod runs reported GPU samples as
unknown. What Prometheus cannot say stays unknown, never 0, and the metrics say why.

Ports: free ones the OS gives (so several checkouts can run this at once); the module starts and stops its own
Prometheus (config and storage in a temporary folder).
"""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

from autodl.dcgm import DcgmSampler
from autodl.metrics import Follower, make_sampler, summarise
from autodl.types import LaunchHandle
from tests.integration.conftest import require_service
from tests.integration.http_wait import get_json as _get
from tests.integration.http_wait import stop_server
from tests.integration.http_wait import wait_for as _wait

pytestmark = pytest.mark.integration

MiB = 1 << 20
POD_GPUS = ("GPU-11111111-0000-0000-0000-000000000000", "GPU-11111111-0000-0000-0000-000000000001")
OTHER_GPU = "GPU-11111111-0000-0000-0000-000000000002"   # node-1's third GPU: another team's pod
RENAMED_GPU = "GPU-22222222-0000-0000-0000-000000000000"  # node-2: scraped with the target's own pod label


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dcgm_text(gpus: list[dict]) -> bytes:
    """dcgm-exporter's exposition (https://github.com/NVIDIA/dcgm-exporter, Kubernetes mode) for ``gpus``."""
    fields = {"DCGM_FI_DEV_FB_USED": ("used_mib", "Framebuffer memory used (in MiB)."),
              "DCGM_FI_DEV_GPU_UTIL": ("util", "GPU utilization (in %)."),
              "DCGM_FI_DEV_GPU_TEMP": ("temp", "GPU temperature (in C)."),
              "DCGM_FI_DEV_POWER_USAGE": ("power", "Power draw (in W).")}
    lines = []
    for name, (key, help_text) in fields.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for g in gpus:
            labels = {"gpu": g["gpu"], "UUID": g["uuid"], "pci_bus_id": f"00000000:0{g['gpu']}:00.0",
                      "device": f"nvidia{g['gpu']}", "modelName": "NVIDIA A100-SXM4-40GB", "Hostname": g["host"],
                      "DCGM_FI_DRIVER_VERSION": "550.54.15"}
            if g.get("pod"):
                labels.update(container="base", namespace=g["namespace"], pod=g["pod"])
            shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{shown}}} {g[key]}")
    return ("\n".join(lines) + "\n").encode()


class Exporter:
    """A stand-in dcgm-exporter on 127.0.0.1: ``gpus`` is served as it is at each scrape."""

    def __init__(self, gpus: list[dict]):
        self.gpus = gpus
        self.port = _free_port()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = dcgm_text(owner.gpus)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()






def node_1() -> list[dict]:
    return [
        {"gpu": "0", "uuid": POD_GPUS[0], "host": "gpu-node-1", "pod": "autodl-train-t1", "namespace": "ml",
         "used_mib": 1000, "util": 40, "temp": 50, "power": 100.0},
        {"gpu": "1", "uuid": POD_GPUS[1], "host": "gpu-node-1", "pod": "autodl-train-t1", "namespace": "ml",
         "used_mib": 3000, "util": 80, "temp": 61, "power": 200.5},
        {"gpu": "2", "uuid": OTHER_GPU, "host": "gpu-node-1", "pod": "other-job", "namespace": "ml",
         "used_mib": 30000, "util": 99, "temp": 80, "power": 390.0},
    ]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Prometheus scraping node-1's exporter with ``honor_labels`` and node-2's as a Kubernetes service monitor does
    (the target carries its own ``pod``/``namespace``: the exporter's become ``exported_pod``/``exported_namespace``)."""
    binary = shutil.which("prometheus")
    require_service(binary is not None, "Prometheus", "install Debian's prometheus package (`bash .ci/prometheus.sh`)")
    folder = tmp_path_factory.mktemp("prometheus-pods")
    one = Exporter(node_1())
    two = Exporter([{"gpu": "0", "uuid": RENAMED_GPU, "host": "gpu-node-2", "pod": "autodl-eval-t1", "namespace": "nlp",
                     "used_mib": 5000, "util": 10, "temp": 45, "power": 70.0}])
    port = _free_port()
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: dcgm-node-1\n    honor_labels: true\n    static_configs: [{{targets: ['127.0.0.1:{one.port}']}}]\n"
        f"  - job_name: dcgm-node-2\n    static_configs: [{{targets: ['127.0.0.1:{two.port}'], "
        "labels: {pod: dcgm-exporter-x7k2p, namespace: gpu-operator}}]\n")
    log = open(folder / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=5).status == 200, "Prometheus ready")
        _wait(lambda: len(_get(f"{url}/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP")["data"]["result"]) == 4,
              "both exporters scraped")
        yield {"url": url, "node_1": one, "node_2": two}
    finally:
        stop_server(proc)
        log.close()
        for e in (one, two):
            e.server.shutdown()
            e.server.server_close()


def pod_handle(pod: str = "autodl-train-t1", namespace: str = "ml", devices: int = 2) -> LaunchHandle:
    return LaunchHandle(launcher="kubernetes", run_key="dag.g.r1", pod_name=pod, namespace=namespace,
                        device_ids=[f"gpu-node-1:{i}" for i in range(devices)])


def test_a_pods_gpu_samples_come_from_its_dcgm_series(prometheus):
    sampler = make_sampler(pod_handle(), [], prometheus_url=prometheus["url"])
    assert isinstance(sampler, DcgmSampler)
    s = sampler.sample()
    assert set(s["devices"]) == set(POD_GPUS), "the other pod's GPU on the same node is not this run's"
    assert s["device_used_bytes"] == (1000 + 3000) * MiB
    assert s["utilization_pct"] == 60.0 and s["temperature_c"] == 61.0 and s["power_w"] == 300.5
    assert s["process_bytes"] is None, "DCGM's default counters have no per-process memory"
    metrics = summarise([s, s], source=sampler.source, duration_s=2.0, exit_code=0, notes=sampler.notes)
    assert metrics.source == "dcgm" and metrics.samples == 2
    assert metrics.mean_utilization_pct == 60.0 and metrics.max_temperature_c == 61.0 and metrics.mean_power_w == 300.5
    assert metrics.device_used_peak_bytes == 4000 * MiB
    assert metrics.peak_memory_bytes is None, "device-wide 'used' is never the run's own peak"


def test_a_pod_whose_exporter_labels_were_renamed_by_the_scrape_config(prometheus):
    s = make_sampler(pod_handle("autodl-eval-t1", "nlp", devices=1), [], prometheus_url=prometheus["url"]).sample()
    assert set(s["devices"]) == {RENAMED_GPU} and s["device_used_bytes"] == 5000 * MiB and s["utilization_pct"] == 10.0


def test_a_pod_without_dcgm_series_stays_unknown_and_the_metrics_say_why(prometheus):
    sampler = make_sampler(pod_handle("autodl-nothing-t1"), [], prometheus_url=prometheus["url"])
    assert sampler.sample() is None and sampler.sample() is None
    metrics = summarise([], source=sampler.source, duration_s=2.0, exit_code=0, notes=sampler.notes)
    assert metrics.mean_utilization_pct is None and metrics.device_used_peak_bytes is None and metrics.mean_power_w is None
    (note,) = metrics.notes
    assert "pod ml/autodl-nothing-t1 unknown in 2 of 2 polls" in note and "no fresh DCGM series" in note


def test_an_unreachable_prometheus_leaves_the_samples_unknown_and_says_so():
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    sampler = make_sampler(pod_handle(), [], prometheus_url=url)
    assert sampler.sample() is None
    metrics = summarise([], source=sampler.source, duration_s=1.0, exit_code=0, notes=sampler.notes)
    assert metrics.mean_utilization_pct is None and metrics.max_temperature_c is None
    assert any("did not answer" in n and "127.0.0.1" in n for n in metrics.notes), metrics.notes


def test_without_a_prometheus_a_pods_gpu_samples_are_unknown_naming_the_option():
    notes: list[str] = []
    assert make_sampler(pod_handle(), [], notes=notes) is None
    assert "[autodl] prometheus_url" in notes[0]


def test_a_container_on_another_host_is_sampled_by_its_devices_uuid(prometheus):
    """A Docker run followed from a machine whose NVML cannot read the booked device (here: no NVML at all)."""
    handle = LaunchHandle(launcher="docker", run_key="dag.g.r2", container_id="c0ffee", device_ids=[OTHER_GPU])
    notes: list[str] = []
    sampler = make_sampler(handle, [OTHER_GPU], notes=notes, prometheus_url=prometheus["url"])
    assert isinstance(sampler, DcgmSampler) and "dcgm-exporter's series in Prometheus" in notes[0]
    s = sampler.sample()
    assert set(s["devices"]) == {OTHER_GPU} and s["device_used_bytes"] == 30000 * MiB and s["power_w"] == 390.0


def test_a_gpu_whose_series_went_stale_leaves_the_pods_sums_unknown(prometheus):
    exporter = prometheus["node_1"]
    url = prometheus["url"]
    exporter.gpus = [g for g in node_1() if g["uuid"] != POD_GPUS[1]]  # GPU 1's series stop (a lost device)
    try:
        sampler = DcgmSampler(url, namespace="ml", pod="autodl-train-t1", expected_devices=2, max_age_s=3)
        s = _wait(lambda: (lambda got: got if got and len(got["devices"]) == 1 else None)(sampler.sample()),
                  "GPU 1's newest sample older than 3 s", limit_s=60)
        assert s["device_used_bytes"] is None and s["power_w"] is None and s["utilization_pct"] is None
        assert s["temperature_c"] == 50.0, "the hottest of those that report"
        assert any("fewer than its 2 device(s)" in n for n in sampler.notes)
    finally:
        exporter.gpus = node_1()


def test_the_follower_of_a_pod_records_its_gpu_samples(prometheus, catalog):
    """The collect's own loop (Follower, as the trigger runs it) over a pod in a fake API server."""
    from autodl.launch.kubernetes import KubernetesLauncher
    from tests.launch.test_kubernetes import FakeCoreV1Api, request_for

    api = FakeCoreV1Api()
    launcher = KubernetesLauncher(api=api, catalog=catalog)
    handle = launcher.launch(request_for(catalog, run_key="dag/g/r3"))
    node = prometheus["node_1"]
    node.gpus = [{**g, "pod": handle.pod_name, "namespace": "default"} if g["uuid"] in POD_GPUS else g for g in node_1()]
    try:
        _wait(lambda: make_sampler(handle, [], prometheus_url=prometheus["url"]).sample(), "the pod's series scraped")
        api.logs[handle.pod_name] = "step 1\n"
        api.set_phase(handle.pod_name, "Running")
        follower = Follower(launcher, handle, sampler=make_sampler(handle, [], prometheus_url=prometheus["url"]),
                            log_sink=lambda _l: None)
        for _ in range(3):
            assert follower.step() is None
        api.set_phase(handle.pod_name, "Succeeded", exit_code=0)
        while follower.step() is None:
            time.sleep(0.05)
        metrics = follower.summary(0)
        follower.close()
    finally:
        node.gpus = node_1()
    assert metrics.source == "dcgm" and metrics.samples == 3
    assert metrics.mean_utilization_pct == 60.0 and metrics.device_used_peak_bytes == 4000 * MiB
    assert not any("GPU samples" in n for n in metrics.notes), metrics.notes


def test_after_prometheus_did_not_answer_the_next_polls_do_not_wait_for_it(monkeypatch):
    """A poll also streams the log and heartbeats the lease: after an unanswered query the next polls within
    RETRY_AFTER_S count as unanswered without asking again."""
    from autodl import dcgm

    asked = []

    def unanswered(*_args, timeout_s, **_kwargs):
        asked.append(timeout_s)
        raise dcgm.InventoryError("GPU samples from Prometheus 'x': cannot read the Prometheus HTTP API")

    monkeypatch.setattr(dcgm, "query", unanswered)
    sampler = DcgmSampler("http://127.0.0.1:9", namespace="ml", pod="p")
    assert [sampler.sample() for _ in range(3)] == [None, None, None]
    assert asked == [dcgm.QUERY_TIMEOUT_S], "asked once, with the short timeout"
    assert "unknown in 3 of 3 polls" in sampler.notes[0]
