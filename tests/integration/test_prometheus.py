"""A real Prometheus server (Debian's ``prometheus``) on 127.0.0.1 scraping a dcgm-exporter-format test endpoint and
autodl's own exporter: the Prometheus inventory source reads the devices (a stale series = unknown), and autodl's
metrics arrive in Prometheus.

Ports: 29090 Prometheus, 29091 the DCGM test endpoint, 29092 autodl's exporter. ``.ci/prometheus.sh`` installs the
server; this module starts and stops its own instance (config and storage in a temporary folder).
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest
from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from autodl.errors import InventoryError
from autodl.inventory import read_inventory
from autodl.ledger import Ledger
from tests.integration.conftest import require_service
from tests.integration.http_wait import get_json as _get
from tests.integration.http_wait import stop_server
from tests.integration.http_wait import wait_for as _wait

pytestmark = pytest.mark.integration

PROM_PORT, DCGM_PORT, AUTODL_PORT = 29090, 29091, 29092
MiB = 1 << 20
BASE = f"prometheus+http://127.0.0.1:{PROM_PORT}"

GPUS = [
    # Hostname, gpu, UUID, modelName, FB_USED MiB, FB_FREE MiB, FB_RESERVED MiB, util %, temp C, power W
    ("gpu-node-1", "0", "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-40GB", 1024, 39936 - 512, 512, 12, 40, 60.5),
    ("gpu-node-1", "1", "GPU-aaaaaaaa-0000-0000-0000-000000000001", "NVIDIA A100-SXM4-40GB", 30720, 9216 - 512, 512, 97, 70, 300.0),
    ("gpu-node-2", "0", "GPU-bbbbbbbb-0000-0000-0000-000000000000", "Tesla V100-PCIE-32GB", 0, 32000, None, 0, 35, 40.0),
]


class DcgmExporterStandIn(Collector):
    """Serves dcgm-exporter's series and labels (https://github.com/NVIDIA/dcgm-exporter) for the GPUs in ``gpus``."""

    def __init__(self):
        self.gpus = list(GPUS)

    def collect(self):
        fields = {"DCGM_FI_DEV_FB_USED": 4, "DCGM_FI_DEV_FB_FREE": 5, "DCGM_FI_DEV_FB_RESERVED": 6,
                  "DCGM_FI_DEV_GPU_UTIL": 7, "DCGM_FI_DEV_GPU_TEMP": 8, "DCGM_FI_DEV_POWER_USAGE": 9}
        labels = ["gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION"]
        for name, col in fields.items():
            family = GaugeMetricFamily(name, name, labels=labels)
            for g in self.gpus:
                if g[col] is not None:
                    family.add_metric([g[1], g[2], f"nvidia{g[1]}", g[3], g[0], f"00000000:0{g[1]}:00.0", "550.54.15"],
                                      g[col])
            yield family






@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Prometheus on 127.0.0.1:29090 scraping the DCGM stand-in (29091) and autodl's exporter (29092) every second."""
    binary = shutil.which("prometheus")
    require_service(binary is not None, "Prometheus", "install Debian's prometheus package (`bash .ci/prometheus.sh`)")
    folder = tmp_path_factory.mktemp("prometheus")
    store = folder / "autodl.db"
    dcgm = DcgmExporterStandIn()
    dcgm_registry = CollectorRegistry(auto_describe=False)
    dcgm_registry.register(dcgm)
    dcgm_server, _ = start_http_server(DCGM_PORT, addr="127.0.0.1", registry=dcgm_registry)
    from autodl.exposition import serve

    autodl_server, _ = serve(AUTODL_PORT, store_url=f"sqlite:///{store}")
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: dcgm\n    static_configs: [{{targets: ['127.0.0.1:{DCGM_PORT}']}}]\n"
        f"  - job_name: autodl\n    static_configs: [{{targets: ['127.0.0.1:{AUTODL_PORT}']}}]\n")
    log = open(folder / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                             f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{PROM_PORT}/-/ready", timeout=5).status == 200,
              "Prometheus ready")
        _wait(lambda: len(_get(f"http://127.0.0.1:{PROM_PORT}/api/v1/query?query=DCGM_FI_DEV_FB_USED")["data"]["result"]) == 3,
              "DCGM series scraped")
        yield {"dcgm": dcgm, "store": f"sqlite:///{store}", "proc": proc}
    finally:
        stop_server(proc)
        log.close()
        dcgm_server.shutdown()
        autodl_server.shutdown()


def test_prometheus_source_reads_dcgm_series(prometheus, catalog):
    """The devices of every node dcgm-exporter reports, from a host without GPUs: memory total = used + free +
    reserved (MiB), utilization, temperature, power, host and index from the labels, catalog model from modelName."""
    inv = read_inventory(f"{BASE}?max_age_s=30", catalog=catalog)
    assert inv.source == f"prometheus:http://127.0.0.1:{PROM_PORT}" and not inv.declared
    assert [(d.host, d.index, d.model) for d in inv.devices] == [
        ("gpu-node-1", 0, "A100-SXM4-40GB"), ("gpu-node-1", 1, "A100-SXM4-40GB"), ("gpu-node-2", 0, "V100-PCIE-32GB")]
    a, busy, v100 = inv.devices
    assert a.device_id == a.uuid == "GPU-aaaaaaaa-0000-0000-0000-000000000000"
    assert a.memory_total_bytes == 40960 * MiB and a.memory_used_bytes == 1024 * MiB
    assert a.utilization_pct == 12 and a.temperature_c == 40 and a.power_w == 60.5 and a.healthy
    assert busy.utilization_pct == 97 and v100.memory_total_bytes == 32000 * MiB
    assert not v100.unknown  # an exporter without FB_RESERVED is not 'unknown'


def test_a_stale_series_is_unknown(prometheus, catalog):
    """When dcgm-exporter stops reporting a GPU (node down, exporter restarted), its series go stale: the device's
    fields become unknown (None) and, all stale, it is unhealthy — never its last values."""
    dcgm = prometheus["dcgm"]
    dcgm.gpus = [g for g in GPUS if g[0] != "gpu-node-2"]
    inv = _wait(lambda: i if not (i := read_inventory(f"{BASE}?max_age_s=3", catalog=catalog)).devices[2].healthy
                else None, "node-2's series going stale")
    stale = inv.devices[2]
    assert stale.memory_used_bytes is None and stale.utilization_pct is None and stale.power_w is None
    assert stale.memory_total_bytes == catalog.get("V100-PCIE-32GB").memory_bytes  # from the catalog, said so
    assert "no fresh DCGM sample" in stale.health_reason and any("stale" in u for u in stale.unknown)
    assert inv.devices[0].healthy and inv.devices[0].memory_used_bytes == 1024 * MiB
    dcgm.gpus = list(GPUS)


def test_unreachable_or_empty_prometheus_is_an_inventory_error(prometheus, catalog):
    with pytest.raises(InventoryError, match="cannot read the Prometheus HTTP API"):
        read_inventory("prometheus+http://127.0.0.1:29099", catalog=catalog)
    with pytest.raises(InventoryError, match="unknown parameter"):
        read_inventory(f"{BASE}?stale=1", catalog=catalog)


def test_autodl_metrics_reach_prometheus(prometheus):
    """autodl's exporter (prometheus-client) publishes leases held and devices booked from its store; Prometheus
    scrapes them."""
    Ledger(prometheus["store"]).book("dag.exporter.run1", ["GPU-aaaaaaaa-0000-0000-0000-000000000001"],
                                     host="gpu-node-1", model="A100-SXM4-40GB")
    query = f"http://127.0.0.1:{PROM_PORT}/api/v1/query?query=autodl_leases_held"
    _wait(lambda: [r for r in _get(query)["data"]["result"] if r["value"][1] == "1"], "autodl_leases_held = 1 scraped")
    devices = _get(f"http://127.0.0.1:{PROM_PORT}/api/v1/query?query=autodl_leased_devices")["data"]["result"]
    assert devices and devices[0]["metric"]["model"] == "A100-SXM4-40GB" and devices[0]["value"][1] == "1"
    runs = _get(f"http://127.0.0.1:{PROM_PORT}/api/v1/query?query=autodl_runs_total")["data"]["result"]
    assert {r["metric"]["outcome"] for r in runs} == {"succeeded", "failed", "not_started", "stopped"}  # every outcome, also at 0
    assert _get(f"http://127.0.0.1:{PROM_PORT}/api/v1/query?query=autodl_waiting_runs")["data"]["result"]
