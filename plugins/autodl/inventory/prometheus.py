"""Inventory from a Prometheus server that scrapes NVIDIA dcgm-exporter: the cluster's GPUs seen from anywhere.

Details: docs/reference/hardware.md#autodlinventoryprometheus.
"""

from __future__ import annotations

import base64
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from autodl.catalog import Catalog, GPUModel
from autodl.errors import InventoryError
from autodl.redact import redact_text, redact_url
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


LOWER_IS_BUSIER = frozenset({"free_mib"})
"""Fields whose smaller value is the busier (conservative) one when duplicated series disagree."""


@dataclass
class _Seen:
    labels: dict[str, str]
    samples: dict[str, list[tuple[float, float | None, str | None]]] = field(default_factory=dict)
    """field -> the newest sample of each series: (age s, value or None, why unusable or None)."""
    targets: dict[str, set[str]] = field(default_factory=dict)  # field -> scrape targets exporting it

    def add(self, what: str, age: float, value: Any, target: str, down: bool) -> None:
        """One series' newest sample (a value that is not a usable number, or from a down target, is kept as why)."""
        self.targets.setdefault(what, set()).add(target)
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if down:
            why = f"target {target} is down (up == 0)"
        elif not math.isfinite(number) or number < 0:
            why = f"not a number ({value})"
        else:
            why = None
        self.samples.setdefault(what, []).append((age, None if why else number, why))

    @property
    def ages(self) -> dict[str, float]:
        return {what: min(a for a, _v, _w in got) for what, got in self.samples.items()}

    def resolve(self, what: str, max_age: float) -> tuple[float | None, str | None]:
        """(the field's value, None) from its fresh usable samples — the busiest when several series disagree —
        or (None, why it is unknown)."""
        got = self.samples.get(what)
        if not got:
            return None, "no DCGM series"
        fresh = [v for a, v, _w in got if v is not None and a <= max_age]
        if fresh:
            return (min(fresh) if what in LOWER_IS_BUSIER else max(fresh)), None
        recent = [w for a, _v, w in got if w is not None and a <= max_age]
        if recent:
            return None, recent[0]
        newest = min(a for a, _v, _w in got)
        return None, f"stale (newest sample {newest:.0f} s old > {max_age:g} s)"


def _busier(what: str, new: float, old: float) -> bool:
    return new < old if what in LOWER_IS_BUSIER else new > old


def _target(labels: dict[str, str]) -> str:
    return f"{labels.get('job', '?')}/{labels.get('instance', '?')}"


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
        raise InventoryError(f"pool source {redact_url(url)!r}: max_age_s and window_s are seconds (numbers).") from None
    if params:
        raise InventoryError(f"pool source {redact_url(url)!r}: unknown parameter(s) {', '.join(sorted(params))}; "
                             "known: max_age_s, window_s.")
    if max_age <= 0 or window < max_age:
        raise InventoryError(f"pool source {redact_url(url)!r}: need 0 < max_age_s <= window_s.")
    base = urllib.parse.urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return base, max_age, window


def _request(url: str) -> urllib.request.Request:
    """A GET of ``url`` with its ``user:password@`` (if any) moved into a Basic ``Authorization`` header,
    which is how Prometheus' ``basic_auth_users`` (and a reverse proxy in front of it) take them; urllib
    itself would read the credentials as part of the host name."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return urllib.request.Request(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    plain = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return urllib.request.Request(plain, headers={"Authorization": f"Basic {token}"})


def query(base: str, promql: str, at: float, *, source: str, what: str = "pool source",
          timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Run an instant query; returns the ``result`` list.

    :param what: what ``source`` is, for the messages (the inventory's "pool source", the collect's samples).
    :param timeout_s: seconds to wait for the server.

    :raises InventoryError: server unreachable, HTTP error, or an error status from Prometheus.
    """
    qs = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(_request(f"{base}/api/v1/query?{qs}"), timeout=timeout_s) as resp:  # noqa: S310
            body = json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read().decode()).get("error", "")
        except Exception:  # noqa: BLE001
            detail = ""
        raise InventoryError(f"{what} {source!r}: Prometheus answered HTTP {exc.code} {detail}; "
                             "check the URL (its path prefix) and the server's log.") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InventoryError(f"{what} {source!r}: cannot read the Prometheus HTTP API at {redact_url(base)} "
                             f"({redact_text(exc)}); "
                             "check that the server runs and the host/port are right.") from None
    if body.get("status") != "success":
        raise InventoryError(f"{what} {source!r}: Prometheus query failed: {body.get('error')}.")
    return body.get("data", {}).get("result", [])


def _key(labels: dict[str, str]) -> tuple[str, str, str]:
    """(host, UUID — or ``gpu<index>`` for a series without one, GPU instance)."""
    return labels.get("Hostname", ""), labels.get("UUID") or f"gpu{labels.get('gpu', '?')}", labels.get("GPU_I_ID", "")


def _down_targets(base: str, at: float, source: str) -> set[str]:
    """Scrape targets Prometheus reports down at ``at`` (``up == 0``), as ``job/instance``; empty when it cannot say."""
    try:
        rows = query(base, "up == 0", at, source=source)
    except InventoryError:
        return set()
    return {_target(dict(r.get("metric") or {})) for r in rows}


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
    shown = redact_url(url)  # the source is logged and recorded: never with its password (issue 23)
    rows = query(base, f'{{__name__=~"DCGM_FI_DEV_({names})"}}[{int(window)}s]', at, source=shown)
    down = _down_targets(base, at, shown) if rows else set()
    seen: dict[tuple[str, str, str], _Seen] = {}
    for row in rows:
        labels = dict(row.get("metric") or {})
        name = labels.pop("__name__", "")
        what = FIELDS.get(name)
        values = row.get("values") or []
        if what is None or not values:
            continue
        ts, value = values[-1]
        try:
            age = at - float(ts)
        except (TypeError, ValueError):
            continue
        target = _target(labels)
        entry = seen.setdefault(_key(labels), _Seen(labels))
        entry.add(what, age, value, target, target in down)
    if not seen:
        raise InventoryError(
            f"pool source {shown!r}: Prometheus at {redact_url(base)} has no DCGM_FI_DEV_* series in the last {window:g} s; "
            "check that it scrapes dcgm-exporter on the GPU nodes (https://github.com/NVIDIA/dcgm-exporter).")
    devices = [_device(entry, catalog, max_age) for entry in seen.values()]
    devices.sort(key=lambda d: (d.host, d.index, d.labels.get("GPU_I_ID", "")))
    notes = [f"{sum(1 for d in devices if d.unknown)} device(s) with stale, missing or unusable DCGM series "
             f"(older than {max_age:g} s, target down, or not a number)"] if any(d.unknown for d in devices) else []
    for key, entry in seen.items():
        dup = sorted({t for ts in entry.targets.values() if len(ts) > 1 for t in ts})
        if dup:
            notes.append(f"{key[1]}{'/gi' + key[2] if key[2] else ''} on {key[0] or '?'} is exported by {len(dup)} "
                         f"targets ({', '.join(dup)}): each field takes the busiest fresh value")
    return Inventory(source=f"prometheus:{redact_url(base)}", declared=False, devices=devices, notes=notes)


def _device(entry: _Seen, catalog: Catalog, max_age: float) -> Device:
    labels = entry.labels
    fresh, unknown, reasons = _fresh_values(entry, max_age)
    model_name = labels.get("modelName", "")
    gpu = catalog.find(model_name) if model_name else None
    model = gpu.name if gpu else (model_name or "unknown")
    uuid = labels.get("UUID") or None
    profile = labels.get("GPU_I_PROFILE")
    instance = labels.get("GPU_I_ID", "")
    total, used = _memory_bytes(fresh, gpu, instance)
    compute_fraction = None
    out_labels = {"dcgm_model_name": model_name, **({"pci_bus_id": labels["pci_bus_id"]} if "pci_bus_id" in labels else {})}
    if instance:
        out_labels.update({"mig_parent": uuid or "", "GPU_I_ID": instance, "mig_profile": profile or "", "catalog_model": model})
        if gpu and total:
            # DCGM does not say the GPU's slice count; the memory share is at most the compute share
            compute_fraction = round(min(1.0, total / gpu.memory_bytes), 4)
            out_labels["compute_fraction_source"] = "memory share (conservative)"
        model = f"{model} MIG {profile or 'instance'}"
    try:
        index = int(labels.get("gpu", "0"))
    except ValueError:
        index = 0
    host = labels.get("Hostname") or "unknown"
    problems = _health_problems(entry, fresh, reasons, uuid, host, unknown)
    if not total:
        unknown.append("memory_total_bytes: unknown (no fresh memory series, and not in the catalog)")
    base_id = uuid or f"{host}:{labels.get('gpu', '?')}"
    return Device(
        device_id=f"{base_id}/gi{instance}" if instance else base_id,
        host=host,
        index=index,
        uuid=None if instance else uuid,
        model=model,
        vendor=gpu.vendor if gpu else "nvidia",
        memory_total_bytes=total,
        memory_used_bytes=used,
        utilization_pct=fresh.get("utilization_pct"),
        temperature_c=fresh.get("temperature_c"),
        power_w=fresh.get("power_w"),
        healthy=not problems,
        health_reason="; ".join(problems) or None,
        compute_fraction=compute_fraction,
        declared=False,
        pci_bus_id=labels.get("pci_bus_id"),
        labels=out_labels,
        unknown=unknown,
    )


def _fresh_values(entry: _Seen, max_age: float) -> tuple[dict[str, float], list[str], list[str]]:
    """(field -> fresh value, ``"field: why"`` of each unknown field, why each sampled field is unusable)."""
    unknown: list[str] = []
    fresh: dict[str, float] = {}
    reasons: list[str] = []
    for what in FIELDS.values():
        value, why = entry.resolve(what, max_age)
        if value is not None:
            fresh[what] = value
        elif what in entry.samples or what != "reserved_mib":  # older exporters do not export FB_RESERVED
            unknown.append(f"{what}: {why}")
            if what in entry.samples and why is not None:  # resolve gives a reason with every None value
                reasons.append(why)
    return fresh, unknown, reasons


def _memory_bytes(fresh: dict[str, float], gpu: GPUModel | None, instance: str) -> tuple[int, int | None]:
    """(total, used) bytes: from the fresh memory series, else the catalog's total for a whole GPU (0 if unknown)."""
    memory_known = "used_mib" in fresh and "free_mib" in fresh
    if memory_known:
        total = int((fresh["used_mib"] + fresh["free_mib"] + fresh.get("reserved_mib", 0.0)) * MIB)
        used: int | None = int(fresh["used_mib"] * MIB)
    else:
        total = gpu.memory_bytes if gpu and not instance else 0
        used = None
    return total, used


def _health_problems(entry: _Seen, fresh: dict[str, float], reasons: list[str], uuid: str | None, host: str,
                     unknown: list[str]) -> list[str]:
    """Why the device is unhealthy (no fresh or usable sample, no UUID label); a missing UUID is added to ``unknown``."""
    labels = entry.labels
    stale_all = not fresh
    problems = []
    if stale_all:
        problems.append(f"no fresh DCGM sample (newest {min(entry.ages.values()):.0f} s old)"
                        if all(r.startswith("stale") for r in reasons)
                        else "no usable DCGM sample (" + "; ".join(sorted(set(reasons))) + ")")
    if uuid is None:
        problems.append(f"dcgm-exporter gives no UUID label for GPU {labels.get('gpu', '?')} on {host}: "
                        "it cannot be pinned (check the exporter's labels / relabelling)")
        unknown.append("uuid: no UUID label")
    return problems
