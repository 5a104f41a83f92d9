"""A pool spans nodes: the pod of a run goes to the node its devices were booked on (a hostname node
selector, so the Kubernetes scheduler still checks resources and taints)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from autodl.errors import LaunchError
from autodl.launch.base import LaunchRequest
from autodl.launch.kubernetes import HOSTNAME_LABEL, KubernetesLauncher
from autodl.types import Device


def _request(catalog, hosts, *, on_cpu=False, labels=None, node_selector=None) -> LaunchRequest:
    devs = [Device(device_id=f"GPU-{i}", host=h, index=i, uuid=f"GPU-{i}", model="A100-SXM4-40GB",
                   memory_total_bytes=40 << 30, labels=labels or {}) for i, h in enumerate(hosts)]
    options = {"node_selector": node_selector} if node_selector else {}
    return LaunchRequest(run_key="d.train.r1", script="/opt/code/train.py", devices=devs, on_cpu=on_cpu,
                         vendor=catalog.vendor("nvidia"), options=options)


def _pod(catalog, request) -> dict:
    return KubernetesLauncher(catalog=catalog).render(request)["pod"]


@pytest.mark.parametrize("host", ["gpu-node-1", "gpu-node-2"])
def test_pod_pinned_to_the_booked_node(catalog, host):
    pod = _pod(catalog, _request(catalog, [host, host]))
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", HOSTNAME_LABEL: host}
    assert "nodeName" not in pod["spec"]
    kubernetes_validate.validate(pod, kubernetes_validate.utils.latest_version(), strict=True)


def test_node_label_from_the_inventory_wins_over_the_host_name(catalog):
    pod = _pod(catalog, _request(catalog, ["gpu-node-1.lab"], labels={HOSTNAME_LABEL: "gpu-node-1"}))
    assert pod["spec"]["nodeSelector"][HOSTNAME_LABEL] == "gpu-node-1"


@pytest.mark.parametrize("hosts,on_cpu", [(["localhost"], False), (["unknown"], False), (["gpu-node-1"], True)])
def test_no_pin_when_the_node_is_unknown_or_the_run_is_on_cpu(catalog, hosts, on_cpu):
    pod = _pod(catalog, _request(catalog, hosts, on_cpu=on_cpu))
    assert HOSTNAME_LABEL not in (pod["spec"].get("nodeSelector") or {})


def test_devices_on_two_nodes_are_refused(catalog):
    with pytest.raises(LaunchError, match="several nodes"):
        _pod(catalog, _request(catalog, ["gpu-node-1", "gpu-node-2"]))


def test_spec_selector_contradicting_the_booking_is_refused(catalog):
    with pytest.raises(LaunchError, match="pins kubernetes.io/hostname=gpu-node-9, but the booked devices are on node gpu-node-1"):
        _pod(catalog, _request(catalog, ["gpu-node-1"], node_selector={HOSTNAME_LABEL: "gpu-node-9"}))


def test_a_spec_selector_for_another_gpu_product_than_the_booked_one_is_refused(catalog):
    """A fresh user's spec set node_selector nvidia.com/gpu.product=Tesla-V100-PCIE-32GB; autodl booked an A100 and
    the pod's selector said V100 only: the pod would land on a GPU nobody booked, or never schedule."""
    with pytest.raises(LaunchError, match="sets nvidia.com/gpu.product=Tesla-V100-PCIE-32GB, but the booked device "
                                          "GPU-0 needs nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB"):
        _pod(catalog, _request(catalog, ["gpu-node-1"], node_selector={"nvidia.com/gpu.product": "Tesla-V100-PCIE-32GB"}))
    same = _pod(catalog, _request(catalog, ["gpu-node-1"], node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}))
    assert same["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
