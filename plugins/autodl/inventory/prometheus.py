"""Inventory from a Prometheus server that scrapes NVIDIA dcgm-exporter: the cluster's GPUs seen from anywhere.

A worker or triggerer without GPUs (or another host's) reads the devices of every node whose
dcgm-exporter the Prometheus server scrapes, through the HTTP API
(https://prometheus.io/docs/prometheus/latest/querying/api/). Chosen with
``AUTODL_POOL=prometheus+http://HOST:PORT`` (``prometheus+https://`` for TLS); query parameters
of that URL tune it: ``max_age_s`` (default :data:`DEFAULT_MAX_AGE_S`) and ``window_s`` (default
:data:`DEFAULT_WINDOW_S`).

Series read (dcgm-exporter's default counters, https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv;
units from DCGM's field reference https://docs.nvidia.com/datacenter/dcgm/latest/dcgm-api/dcgm-api-field-ids.html):
``DCGM_FI_DEV_FB_USED`` / ``_FB_FREE`` / ``_FB_RESERVED`` (MiB), ``DCGM_FI_DEV_GPU_UTIL`` (%),
``DCGM_FI_DEV_GPU_TEMP`` (°C), ``DCGM_FI_DEV_POWER_USAGE`` (W), with the labels ``Hostname``,
``gpu`` (index), ``UUID``, ``modelName``, ``pci_bus_id`` and, for MIG instances, ``GPU_I_PROFILE`` and ``GPU_I_ID``.

A series whose newest sample is older than ``max_age_s`` is *stale*: that field is unknown (None),
never its old value and never 0. A device all of whose series are stale is listed unhealthy ("no
fresh DCGM sample"); its memory total then comes from the catalog. A device is one
(``Hostname``, ``UUID``, ``GPU_I_ID``).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from autodl.catalog import Catalog
from autodl.errors import InventoryError
from autodl.types import Device, Inventory

MIB = 1 << 20

FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_FB_USED": "used_mib",
    "DCGM_FI_DEV_FB_FREE": "free_mib",
    "DCGM_FI_DEV_FB_RESERVED": "reserved_mib",
    "DCGM_FI_DEV_GPU_UTIL": "utilization_pct",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
}
"""dcgm-exporter series -> what autodl reads from it (see the module docstring for units)."""

DEFAULT_MAX_AGE_S = 60.0
"""A sample older than this is stale (4 x dcgm-exporter's default collection interval of 15 s, i.e.
three missed scrapes at Prometheus' common 15 s scrape interval)."""

DEFAULT_WINDOW_S = 300.0
"""How far back the query looks for a device's series, so a device whose series all went stale is
still listed (unhealthy) rather than vanishing; Prometheus' own lookback delta is 5 minutes."""

TIMEOUT_S = 10.0
"""Seconds to wait for the Prometheus server."""


@dataclass
class _Seen:
    labels: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)
    ages: dict[str, float] = field(default_factory=dict)


def parse_url(url: str) -> tuple[str, float, float]:
    """``prometheus+http://host:port/prefix?max_age_s=..&window_s=..`` -> (HTTP base URL, max age s, window s).

    :raises InventoryError: for a bad parameter.
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.split("+", 1)[-1]
    params = dict(urllib.parse.parse_qsl(parts.query))
    try:
        max_age = float(params.pop("max_age_s", DEFAULT_MAX_AGE_S))
        window = float(params.pop("window_s", DEFAULT_WINDOW_S))
    except ValueError:
        raise InventoryError(f"pool source {url!r}: max_age_s and window_s are seconds (numbers).") from None
    if params:
        raise InventoryError(f"pool source {url!r}: unknown parameter(s) {', '.join(sorted(params))}; "
                             "known: max_age_s, window_s.")
    if max_age <= 0 or window < max_age:
        raise InventoryError(f"pool source {url!r}: need 0 < max_age_s <= window_s.")
    base = urllib.parse.urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return base, max_age, window


def query(base: str, promql: str, at: float, *, source: str) -> list[dict[str, Any]]:
    """Run an instant query; returns the ``result`` list.

    :raises InventoryError: server unreachable, HTTP error, or an error status from Prometheus.
    """
    qs = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
    url = f"{base}/api/v1/query?{qs}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 - the configured server
            body = json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read().decode()).get("error", "")
        except Exception:  # noqa: BLE001
            detail = ""
        raise InventoryError(f"pool source {source!r}: Prometheus answered HTTP {exc.code} {detail}; "
                             "check the URL (its path prefix) and the server's log.") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InventoryError(f"pool source {source!r}: cannot read the Prometheus HTTP API at {base} ({exc}); "
                             "check that the server runs and the host/port are right.") from None
    if body.get("status") != "success":
        raise InventoryError(f"pool source {source!r}: Prometheus query failed: {body.get('error')}.")
    return body.get("data", {}).get("result", [])


def _key(labels: dict[str, str]) -> tuple[str, str, str]:
    return labels.get("Hostname", ""), labels.get("UUID", ""), labels.get("GPU_I_ID", "")


def read_prometheus(url: str, catalog: Catalog, *, now: float | None = None) -> Inventory:
    """The devices dcgm-exporter reports through the Prometheus server at ``url``.

    :param url: ``prometheus+http://HOST:PORT[/prefix][?max_age_s=S&window_s=S]``.
    :param catalog: maps ``modelName`` (NVML's product name) to catalog models.
    :param now: evaluation time, unix seconds (default: now).
    :returns: an :class:`Inventory` (``declared=False``, ``source='prometheus:<base URL>'``) in
        (host, index) order; stale fields None and named in ``Device.unknown``.
    :raises InventoryError: server unreachable or failing, or no DCGM series at all in the window.
    """
    base, max_age, window = parse_url(url)
    at = time.time() if now is None else now
    names = "|".join(n.removeprefix("DCGM_FI_DEV_") for n in FIELDS)
    rows = query(base, f'{{__name__=~"DCGM_FI_DEV_({names})"}}[{int(window)}s]', at, source=url)
    seen: dict[tuple[str, str, str], _Seen] = {}
    for row in rows:
        labels = dict(row.get("metric") or {})
        name = labels.pop("__name__", "")
        what = FIELDS.get(name)
        values = row.get("values") or []
        if what is None or not values or not labels.get("UUID"):
            continue
        ts, value = values[-1]
        entry = seen.setdefault(_key(labels), _Seen(labels))
        entry.ages[what] = at - float(ts)
        try:
            entry.values[what] = float(value)
        except ValueError:
            continue
    if not seen:
        raise InventoryError(
            f"pool source {url!r}: Prometheus at {base} has no DCGM_FI_DEV_* series in the last {window:g} s; "
            "check that it scrapes dcgm-exporter on the GPU nodes (https://github.com/NVIDIA/dcgm-exporter).")
    devices = [_device(entry, catalog, max_age) for entry in seen.values()]
    devices.sort(key=lambda d: (d.host, d.index, d.labels.get("GPU_I_ID", "")))
    notes = [f"{sum(1 for d in devices if d.unknown)} device(s) with stale or missing DCGM series (older than {max_age:g} s)"] \
        if any(d.unknown for d in devices) else []
    return Inventory(source=f"prometheus:{base}", declared=False, devices=devices, notes=notes)


def _device(entry: _Seen, catalog: Catalog, max_age: float) -> Device:
    labels = entry.labels
    unknown: list[str] = []
    fresh: dict[str, float] = {}
    for what in FIELDS.values():
        if what not in entry.ages:
            if what != "reserved_mib":  # older exporters do not export FB_RESERVED
                unknown.append(f"{what}: no DCGM series")
        elif entry.ages[what] > max_age or what not in entry.values:
            unknown.append(f"{what}: stale (newest sample {entry.ages[what]:.0f} s old > {max_age:g} s)")
        else:
            fresh[what] = entry.values[what]
    model_name = labels.get("modelName", "")
    gpu = catalog.find(model_name) if model_name else None
    model = gpu.name if gpu else (model_name or "unknown")
    uuid = labels["UUID"]
    profile = labels.get("GPU_I_PROFILE")
    instance = labels.get("GPU_I_ID", "")
    memory_known = "used_mib" in fresh and "free_mib" in fresh
    if memory_known:
        total = int((fresh["used_mib"] + fresh["free_mib"] + fresh.get("reserved_mib", 0.0)) * MIB)
        used: int | None = int(fresh["used_mib"] * MIB)
    else:
        total = gpu.memory_bytes if gpu and not instance else 0
        used = None
    compute_fraction = None
    out_labels = {"dcgm_model_name": model_name, **({"pci_bus_id": labels["pci_bus_id"]} if "pci_bus_id" in labels else {})}
    if instance:
        out_labels.update({"mig_parent": uuid, "GPU_I_ID": instance, "mig_profile": profile or "", "catalog_model": model})
        if gpu and total:
            # DCGM does not say the GPU's slice count; the memory share is at most the compute share
            compute_fraction = round(min(1.0, total / gpu.memory_bytes), 4)
            out_labels["compute_fraction_source"] = "memory share (conservative)"
        model = f"{model} MIG {profile or 'instance'}"
    stale_all = not fresh
    try:
        index = int(labels.get("gpu", "0"))
    except ValueError:
        index = 0
    return Device(
        device_id=f"{uuid}/gi{instance}" if instance else uuid,
        host=labels.get("Hostname") or "unknown",
        index=index,
        uuid=None if instance else uuid,
        model=model,
        vendor=gpu.vendor if gpu else "nvidia",
        memory_total_bytes=total,
        memory_used_bytes=used,
        utilization_pct=fresh.get("utilization_pct"),
        temperature_c=fresh.get("temperature_c"),
        power_w=fresh.get("power_w"),
        healthy=not stale_all,
        health_reason=f"no fresh DCGM sample (newest {min(entry.ages.values()):.0f} s old)" if stale_all else None,
        compute_fraction=compute_fraction,
        declared=False,
        pci_bus_id=labels.get("pci_bus_id"),
        labels=out_labels,
        unknown=unknown,
    )
