"""A device's own figures drive fit, advice, speed and cost; devices checked empty before a lease is freed;
Kubernetes resources and labels per vendor and MIG strategy; the run timeline."""

from __future__ import annotations

import json

import pytest

from autodl import cli, pipeline
from autodl.catalog import load_catalog
from autodl.inventory import read_pool_file
from autodl.inventory.effective import effective_max_batch, effective_model
from autodl.ledger import Ledger
from autodl.metrics import wait_devices_clear
from autodl.policy import place
from autodl.spec import ResourcePolicySection
from autodl.types import Device, LaunchHandle, MemoryBreakdown, ResourceProfile
from tests.hardware.conftest import GiB


def profile_needing(peak: int, batch: int = 64) -> ResourceProfile:
    return ResourceProfile(script="t.py", params=10**6, peak_memory_bytes=peak, batch_size=batch, flops_per_step=1e12,
                           breakdown=MemoryBreakdown(weights_bytes=2 * GiB, activations_bytes=peak - 2 * GiB),
                           activation_bytes_per_sample=(peak - 2 * GiB) // batch)


def test_a_declared_12gb_card_gets_advice_on_its_own_memory(tmp_path, catalog):
    """Seen: a card declared with 12 GiB whose catalog model has 24 GiB got no suggestion at all — advice used the
    catalog's memory, on which the run fits. The advice now uses the device's own 12 GiB."""
    pool = tmp_path / "pool.yaml"
    pool.write_text("host: h\ndevices:\n  - {index: 0, model: RTX-3090, memory_total_bytes: 12884901888}\n")
    inv = read_pool_file(pool, catalog)
    profile = profile_needing(14 * GiB)
    decision = place(profile, inv, catalog=catalog, policy=ResourcePolicySection())
    assert not decision.fits and decision.suggestions
    assert any("RTX-3090" in s and "12.0 GiB" in s and "largest batch that fits" in s for s in decision.suggestions)
    assert effective_max_batch(profile, inv.devices, 0.85) == {"RTX-3090 (12.0 GiB)": profile.max_batch_size(12 * GiB, 0.85)}


def test_effective_model_scales_compute_bandwidth_and_cost_of_a_mig_slice(catalog):
    a100 = catalog.get("A100-SXM4-40GB")
    mig = Device(device_id="MIG-1", index=0, uuid="MIG-1", model="A100-SXM4-40GB MIG 3g.20gb", memory_total_bytes=20 * GiB,
                 compute_fraction=3 / 7, labels={"catalog_model": "A100-SXM4-40GB"})
    eff = effective_model(mig, catalog)
    assert eff.name == "A100-SXM4-40GB MIG 3g.20gb" and eff.memory_bytes == 20 * GiB
    assert eff.fp32_tflops == pytest.approx(a100.fp32_tflops * 3 / 7)
    assert eff.cost_per_hour_usd == pytest.approx(a100.cost_per_hour_usd * 3 / 7)
    assert eff.memory_bandwidth_gbps == pytest.approx(a100.memory_bandwidth_gbps / 2)
    whole = Device(device_id="GPU-1", index=0, model="A100-SXM4-40GB", memory_total_bytes=a100.memory_bytes)
    assert effective_model(whole, catalog) is a100


def test_unknown_used_memory_is_not_free(catalog):
    """A device whose used memory could not be read is not placed on now (unknown is not idle), and says why."""
    devs = [Device(device_id="a", index=0, model="A100-SXM4-40GB", memory_total_bytes=40 * GiB, memory_used_bytes=None)]
    from autodl.types import Inventory

    decision = place(profile_needing(4 * GiB), Inventory(source="t", declared=False, devices=devs), catalog=catalog,
                     policy=ResourcePolicySection())
    assert decision.fits and not decision.available
    assert "free memory unknown" in decision.candidates[0].reasons[0]


def test_devices_checked_empty_before_the_lease_is_freed(tmp_path, fake_nvml, monkeypatch):
    """After a stop, NVML still shows the run's process (pid 412399, not in the launch-time baseline) on the booked
    A100: the lease is kept and the record says why; `autodl leases --release` frees it by hand."""
    fake_nvml("A08-17-nvml_shared.json")
    uuid = "GPU-88888888-a100-0000-0000-000000000000"
    ctx = pipeline.RunContext(run_key="dag.shared.run1")
    folder = pipeline.state_dir(ctx.run_key)
    (folder / "nvml_baseline.json").write_text(json.dumps({uuid: {"412345": 10 * GiB}}))
    assert not wait_devices_clear([uuid], folder, timeout_s=0.3, poll_s=0.1, log=lambda _l: None)
    Ledger().book(ctx.run_key, [uuid], model="A100-SXM4-40GB")
    handle = LaunchHandle(launcher="local", run_key=ctx.run_key, device_ids=[uuid], exit_path=str(tmp_path / "x.exit"))
    (tmp_path / "x.exit").write_text("0")
    lines: list[str] = []
    import autodl.metrics as metrics_module

    original = metrics_module.wait_devices_clear  # a short wait for the stuck process in this test
    monkeypatch.setattr(metrics_module, "wait_devices_clear",
                        lambda *a, **k: original(*a, **{**k, "timeout_s": 0.3, "poll_s": 0.1}))
    out = pipeline.step_release_and_record(ctx, script="t.py", spec_path=None, profile_out=None, selection=None,
                                           handle_json=handle.to_json(), metrics_json={"exit_code": 0}, log=lines.append)
    assert not out["lease_released"] and Ledger().get(ctx.run_key) is not None
    assert any("pid 412399" in line for line in lines)
    assert "lease kept" in pipeline.read_failures(ctx.run_key)["release"]
    # the lease records no owner: releasing it by hand takes --force (issue 13)
    assert cli.main(["leases", "--release", ctx.run_key, "--force"]) == 0 and Ledger().get(ctx.run_key) is None


def test_devices_clear_when_the_runs_processes_are_gone(tmp_path, fake_nvml):
    fake_nvml("A08-17-nvml_shared.json")
    uuid = "GPU-88888888-a100-0000-0000-000000000000"
    (tmp_path / "nvml_baseline.json").write_text(json.dumps({uuid: {"412345": 1, "412399": 1}}))
    lines: list[str] = []
    assert wait_devices_clear([uuid], tmp_path, log=lines.append) and "checked empty" in lines[-1]
    assert wait_devices_clear([uuid], tmp_path / "nothing", log=lines.append) and "no launch-time NVML baseline" in lines[-1]


# ---------------------------------------------------------------------------------------------- Kubernetes
def _pod(catalog, device: Device, vendor: str, monkeypatch=None, strategy=None):
    from kubernetes.client import ApiClient

    from autodl.launch import LaunchRequest
    from autodl.launch.kubernetes import KubernetesLauncher

    if strategy:
        monkeypatch.setenv("AUTODL_MIG_STRATEGY", strategy)
    req = LaunchRequest(run_key="k", script="/code/t.py", workdir="/code", devices=[device], vendor=catalog.vendor(vendor))
    return ApiClient().sanitize_for_serialization(KubernetesLauncher(catalog=catalog).build_pod(req))


@pytest.mark.parametrize("strategy,resource,product", [
    ("single", "nvidia.com/gpu", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
    ("mixed", "nvidia.com/mig-1g.5gb", "NVIDIA-A100-SXM4-40GB"),
])
def test_mig_instance_pods_follow_the_device_plugins_strategy(catalog, monkeypatch, strategy, resource, product):
    """NVIDIA k8s-device-plugin MIG strategies: single -> nvidia.com/gpu on nodes whose GFD product label carries
    the profile; mixed -> nvidia.com/mig-<profile> on nodes of the parent product."""
    mig = Device(device_id="MIG-1", index=0, uuid="MIG-1", model="A100-SXM4-40GB MIG 1g.5gb", memory_total_bytes=5 * GiB,
                 compute_fraction=1 / 7, labels={"catalog_model": "A100-SXM4-40GB", "mig_profile": "1g.5gb"})
    pod = _pod(catalog, mig, "nvidia", monkeypatch, strategy)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {resource: "1"}
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": product}


def test_ascend_pod_uses_the_device_plugins_resource_and_node_label(catalog):
    """Ascend Device Plugin: resource huawei.com/Ascend910, node label accelerator=huawei-Ascend910 (MindCluster docs)."""
    npu = Device(device_id="n:0", index=0, model="Ascend-910B", vendor="ascend", memory_total_bytes=64 * GiB)
    pod = _pod(catalog, npu, "ascend")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"huawei.com/Ascend910": "1"}
    assert pod["spec"]["nodeSelector"] == {"accelerator": "huawei-Ascend910"}


def test_kunlun_pod_has_no_invented_product_label(catalog):
    """Kunlun: resource kunlunxin.com/xpu; no node label for the model is documented, so none is selected."""
    xpu = Device(device_id="x:0", index=0, model="Kunlun-R200", vendor="kunlun", memory_total_bytes=16 * GiB)
    pod = _pod(catalog, xpu, "kunlun")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"kunlunxin.com/xpu": "1"}
    assert not pod["spec"].get("nodeSelector")


def test_vendor_table_names_its_sources(catalog):
    for name, vendor in load_catalog().vendors.items():
        # every vendor says where each launcher's behaviour comes from; one that packs also says where sharing does
        assert {"visibility", "launch", "docker", "kubernetes"} <= set(vendor.sources), name
        assert set(vendor.sources) - {"visibility", "launch", "docker", "kubernetes"} <= {"sharing"}, name
        assert ("sharing" in vendor.sources) == bool(getattr(vendor, "k8s_shared_resource", None)), name
        assert all("http" in text for text in vendor.sources.values()), name


# ---------------------------------------------------------------------------------------------- timeline
def test_timeline_png_beside_the_log_and_runs_plot(tmp_path, capsys):
    """A run's timeline (memory and utilization against time, the estimate as a line) is written beside its log
    at the end of collect, and `autodl runs --plot RUN_KEY` draws it again and says where."""
    import shutil

    from autodl.config import default_pool_file, include_dir

    script = tmp_path / "simple_cnn.py"
    shutil.copy(include_dir() / "scripts" / "simple_cnn.py", script)
    spec = tmp_path / "spec.yaml"
    spec.write_text("task: {script: simple_cnn.py, args: ['--epochs', '1', '--samples', '128'], batch_size_per_gpu: 32}\n")
    ctx = pipeline.RunContext(run_key="dag.plot.run1")
    pool = str(default_pool_file())
    out = pipeline.step_profile(None, str(spec), pool=pool, probe=False, run_key=ctx.run_key, log=lambda _l: None)
    sel = pipeline.step_select(ctx, out, pool=pool, log=lambda _l: None)
    handle = pipeline.step_launch(ctx, out, sel, log=lambda _l: None)
    lines: list[str] = []
    metrics = pipeline.step_collect(ctx, handle, log=lines.append, interval_s=0.2)
    png = pipeline.state_dir(ctx.run_key) / "timeline.png"
    assert metrics["exit_code"] == 0 and f"timeline: {png}" in lines
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert metrics["reserved_peak_bytes"] and metrics["peak_source"] == "paddle_reserved"
    pipeline.step_release_and_record(ctx, script=None, spec_path=str(spec), profile_out=out, selection=sel,
                                     handle_json=handle, metrics_json=metrics, log=lambda _l: None)
    png.unlink()
    assert cli.main(["runs", "--plot", ctx.run_key]) == 0
    assert capsys.readouterr().out.strip() == str(png) and png.stat().st_size > 10_000
    assert cli.main(["runs", "--plot", "no.such.run"]) == 9
