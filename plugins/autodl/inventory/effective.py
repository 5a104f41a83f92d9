"""A device's own figures: the catalog model scaled to what this device really is (a MIG slice, a declared card).

Fit, advice, speed and cost must use the device's own memory and compute share, not the catalog
model's: a MIG 1g.5gb instance of an A100 has ~5 GB and 1/7 of its compute, a card declared with
12 GiB has 12 GiB whatever its catalog entry says.
"""

from __future__ import annotations

from autodl.catalog import Catalog, GPUModel
from autodl.types import Device, ResourceProfile

GiB = 1 << 30


def base_model(device: Device, catalog: Catalog) -> GPUModel | None:
    """The catalog entry behind ``device``: its own model, or its MIG parent's (``labels['catalog_model']``)."""
    return catalog.find(device.model) or (catalog.find(device.labels["catalog_model"])
                                          if device.labels.get("catalog_model") else None)


def effective_model(device: Device, catalog: Catalog) -> GPUModel | None:
    """The device as a :class:`GPUModel` with its own figures, or None when the catalog lacks its model.

    * memory: the device's ``memory_total_bytes`` (a MIG instance's slice, a declared card's memory);
    * compute (``*_tflops``) and price: the catalog's times ``compute_fraction`` when the device has one;
    * memory bandwidth: the catalog's times the device's share of the model's memory when it has a
      ``compute_fraction`` (MIG memory slices each carry their own memory controllers, so bandwidth
      divides with memory: NVIDIA MIG User Guide, https://docs.nvidia.com/datacenter/tesla/mig-user-guide/);
    * name: the catalog name, or the device's own model spelling for a MIG instance
      (``A100-SXM4-40GB MIG 1g.5gb``), so it is not mistaken for the whole GPU.

    A whole device whose figures equal the catalog's gets the catalog entry itself.
    """
    base = base_model(device, catalog)
    if base is None:
        return None
    memory = device.memory_total_bytes or base.memory_bytes
    fraction = device.compute_fraction
    if fraction is None and memory == base.memory_bytes and catalog.find(device.model) is base:
        return base
    update: dict = {"memory_bytes": memory}
    if catalog.find(device.model) is None:
        update["name"] = device.model
    if fraction is not None and 0 < fraction < 1:
        for key in ("fp32_tflops", "fp16_tflops", "bf16_tflops"):
            value = getattr(base, key)
            if value:
                update[key] = value * fraction
        if base.cost_per_hour_usd is not None:
            update["cost_per_hour_usd"] = base.cost_per_hour_usd * fraction
        update["memory_bandwidth_gbps"] = base.memory_bandwidth_gbps * min(1.0, memory / base.memory_bytes)
        update["nvlink_gbps"] = 0
    return base.model_copy(update=update)


def effective_max_batch(profile: ResourceProfile, devices: list[Device], threshold: float) -> dict[str, int | None]:
    """Largest per-device batch under ``threshold`` of each distinct device kind's own memory.

    :returns: ``{"<model> (<memory> GiB)": batch}``, 0 where even batch 1 does not fit, None (JSON null) when
        the profile's parameter count is unknown.
    """
    out: dict[str, int | None] = {}
    for d in devices:
        if not d.memory_total_bytes:
            continue
        key = f"{d.model} ({d.memory_total_bytes / GiB:.1f} GiB)"
        if key not in out:
            out[key] = profile.max_batch_size(d.memory_total_bytes, threshold)
    return out
