"""The GPU catalog: device models' memory, TFLOPS, bandwidth, vendor and tags, read from ``include/catalog``.

Figures live in YAML with a ``source:`` per entry (``include/catalog/gpus.yaml``); the vendor table
(``include/catalog/vendors.yaml``) says how each accelerator vendor is pinned and named.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autodl.config import include_dir, read_yaml
from autodl.errors import CatalogError
from autodl.fields import CatalogFigure, CatalogFigureOrZero, DeviceBytes
from autodl.inputs import clip, short


class GPUModel(BaseModel):
    """One device model. Memory in bytes, compute in dense peak TFLOPS, bandwidth in GB/s."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vendor: str
    nvml_names: list[str] = Field(default_factory=list)
    memory_bytes: DeviceBytes
    fp32_tflops: CatalogFigure | None = None
    fp16_tflops: CatalogFigure | None = None
    bf16_tflops: CatalogFigure | None = None
    memory_bandwidth_gbps: CatalogFigure
    nvlink_gbps: CatalogFigureOrZero = 0
    tags: list[str] = Field(default_factory=list)
    k8s_resource: str | None = None
    cost_per_hour_usd: CatalogFigureOrZero | None = None
    cost_source: str | None = None
    source: str

    def peak_tflops(self, precision: str = "fp32") -> float:
        """Dense peak TFLOPS for ``precision`` ('fp32', 'fp16', 'bf16').

        A missing figure falls back to the nearest published one: bf16 -> fp16; fp16/bf16 -> fp32;
        fp32 -> fp16 / 2 (tensor units run FP32 at no better than half their FP16 rate on every part in
        this catalog that publishes both, e.g. A100 19.5 vs 312, Kunlun R200 32 vs 128).
        """
        if precision == "bf16":
            value = self.bf16_tflops or self.fp16_tflops or self.fp32_tflops
        elif precision == "fp16":
            value = self.fp16_tflops or self.fp32_tflops
        else:
            value = self.fp32_tflops or (self.fp16_tflops / 2 if self.fp16_tflops else None)
        if not value:
            raise CatalogError(f"catalog entry {self.name}: no TFLOPS figure for {precision}; add one with its source.")
        return float(value)


class VendorInfo(BaseModel):
    """How one accelerator vendor's devices are pinned and requested: process, distributed launcher,
    container, pod (field meanings in ``include/catalog/vendors.yaml``'s header, sources per entry)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    visible_devices_env: str
    extra_env: dict[str, str] = Field(default_factory=dict)
    container_visible_env: str
    cpu_only_container_env: dict[str, str] = Field(default_factory=dict)
    paddle_device: str
    launch_devices: Literal["members", "positions"] = Field(
        "positions", description="What paddle.distributed.launch --devices lists: entries of the visibility variable, or 0..n-1.")
    k8s_resource: str
    k8s_product_label: str | None = None
    k8s_product_values: dict[str, str] = Field(default_factory=dict)
    k8s_taint_key: str
    k8s_mig_strategy: Literal["single", "mixed"] | None = None
    k8s_shared_resource: str | None = Field(
        None, description="Extended resource a packed (shared) 1-device pod asks for: the device plugin's time-sliced "
                          "replicas; None: the vendor has none (a packed run asks for its whole-device resource).")
    docker_capabilities: list[list[str]] = Field(default_factory=list)
    docker_runtime: str | None = None
    docker_device_nodes: list[str] = Field(default_factory=list, description="Per booked device; '{index}' = host index.")
    docker_shared_device_nodes: list[str] = Field(default_factory=list)
    docker_mounts: list[str] = Field(default_factory=list, description="Host paths mounted read-only with the device nodes.")
    source: str
    sources: dict[str, str] = Field(default_factory=dict, description="Where each convention is documented.")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


class Catalog:
    """Device models by name, NVML name or a loose spelling ('A100 SXM4 40GB', 'rtx3090')."""

    def __init__(self, models: list[GPUModel], vendors: dict[str, VendorInfo], source: str = "<memory>"):
        self.models = {m.name: m for m in models}
        self.vendors = vendors
        self.source = source
        self._index: dict[str, str] = {}
        for m in models:
            for alias in [m.name, *m.nvml_names]:
                self._index[_norm(alias)] = m.name

    def __contains__(self, name: str) -> bool:
        return self.find(name) is not None

    def find(self, name: str) -> GPUModel | None:
        """The model for ``name`` (catalog name, NVML name or a loose spelling), or None."""
        key = self._index.get(_norm(name))
        if key is None:
            stripped = _norm(re.sub(r"^(nvidia|tesla|geforce)\s+", "", name.strip(), flags=re.I))
            key = self._index.get(stripped)
        return self.models.get(key) if key else None

    def get(self, name: str) -> GPUModel:
        """Like :meth:`find` but raises.

        :raises CatalogError: naming the unknown model and the known ones.
        """
        model = self.find(name)
        if model is None:
            known = ", ".join(sorted(self.models))
            raise CatalogError(
                f"device model {name!r} is not in the GPU catalog ({self.source}); "
                f"use one of: {known}, or add an entry with its source."
            )
        return model

    def vendor(self, vendor: str) -> VendorInfo:
        """:raises CatalogError: when the vendor table lacks ``vendor``."""
        try:
            return self.vendors[vendor]
        except KeyError:
            raise CatalogError(
                f"accelerator vendor {vendor!r} is not in include/catalog/vendors.yaml; "
                f"known: {', '.join(sorted(self.vendors))}."
            ) from None


def _load_yaml(path: Path) -> Any:
    return read_yaml(path, CatalogError, "catalog file not found; set AUTODL_CATALOG or restore include/catalog.")


def load_catalog(path: str | Path | None = None, vendors_path: str | Path | None = None) -> Catalog:
    """Read the GPU catalog and the vendor table.

    :param path: catalog YAML; default ``include/catalog/gpus.yaml`` (or ``$AUTODL_CATALOG``).
    :param vendors_path: vendor YAML; default ``vendors.yaml`` beside the catalog.
    :raises CatalogError: on a missing file or an invalid entry (naming entry and field).
    """
    gpus = Path(path or os.environ.get("AUTODL_CATALOG") or include_dir() / "catalog" / "gpus.yaml")
    vend = Path(vendors_path or gpus.parent / "vendors.yaml")
    # realpath, not Path.resolve: a symlink loop is reported by the reader, never raised as RuntimeError here
    return _load_cached(os.path.realpath(gpus), os.path.realpath(vend))


@lru_cache(maxsize=8)
def _load_cached(gpus: str, vend: str) -> Catalog:
    raw = _load_yaml(Path(gpus))
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), list) or not raw["models"]:
        raise CatalogError(f"{gpus}: a GPU catalog is a mapping with a non-empty 'models:' list; "
                           "fix AUTODL_CATALOG or restore include/catalog/gpus.yaml.")
    models = []
    for i, entry in enumerate(raw.get("models") or []):
        try:
            models.append(GPUModel.model_validate(entry))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            name = entry.get("name", f"#{i}") if isinstance(entry, dict) else f"#{i}"
            raise CatalogError(f"{gpus}: model {clip(name, 60)}: field '{clip(field, 80)}': {clip(err['msg'], 200)} "
                               f"(got {short(err.get('input'), 60)}).") from None
    if not os.path.isfile(vend):
        raise CatalogError(f"{vend}: the vendor table is missing; it must sit beside the GPU catalog {gpus} "
                           "(copy include/catalog/vendors.yaml there).")
    raw_vend = _load_yaml(Path(vend)) or {}
    raw_v = raw_vend.get("vendors") if isinstance(raw_vend, dict) else None
    if not isinstance(raw_v, dict) or not raw_v:
        raise CatalogError(f"{vend}: a vendor table is a mapping with a non-empty 'vendors:' mapping; "
                           "restore include/catalog/vendors.yaml.")
    vendors = {}
    for name, entry in raw_v.items():
        try:
            vendors[name] = VendorInfo.model_validate(entry)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise CatalogError(f"{vend}: vendor {clip(name, 60)}: field '{clip(field, 80)}': {clip(err['msg'], 200)}.") from None
    for m in models:
        if m.vendor not in vendors:
            raise CatalogError(f"{gpus}: model {m.name}: vendor {m.vendor!r} missing from {vend}.")
    return Catalog(models, vendors, source=gpus)
