"""GPU samples of a pod or container from dcgm-exporter's series in Prometheus, where NVML here cannot see the devices.

Details: docs/reference/hardware.md#autodldcgm.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from autodl.errors import InventoryError
from autodl.inventory.prometheus import DEFAULT_MAX_AGE_S, MIB, query
from autodl.redact import redact_url

FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_FB_USED": "used_mib",
    "DCGM_FI_DEV_GPU_UTIL": "utilization_pct",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
}
"""dcgm-exporter series -> the sample field it gives (units in the module docstring)."""

MAX_AGE_S = DEFAULT_MAX_AGE_S
"""A series whose newest sample is older than this is not used (the inventory's rule,
:data:`autodl.inventory.prometheus.DEFAULT_MAX_AGE_S`)."""

QUERY_TIMEOUT_S = 2.0
"""Seconds a poll waits for Prometheus: the collect's poll also streams the log and heartbeats the lease, so a
slow server must not hold it for the inventory's 10 s."""

RETRY_AFTER_S = 30.0
"""After Prometheus did not answer, polls within this many seconds do not ask again (they count as unanswered)."""

_SAFE_VALUE = re.compile(r"[A-Za-z0-9._-]+")
_UUID = re.compile(r"(GPU|MIG)-[A-Za-z0-9-]+")


def _quoted(value: str) -> str:
    """``value`` as a PromQL string literal (a Kubernetes name needs no escape; anything else is refused)."""
    if not _SAFE_VALUE.fullmatch(value):
        raise ValueError(f"{value!r} is not a Kubernetes name or device UUID")
    return f'"{value}"'


class DcgmSampler:
    """Samples a pod's (``namespace`` and ``pod``) or a container's (``device_uuids``) devices from Prometheus.

    A sample has the keys :class:`autodl.metrics.NvmlSampler` gives, with the same rules: ``device_used_bytes``
    and ``power_w`` summed (None unless every device reported), ``utilization_pct`` the mean (None unless every
    device reported), ``temperature_c`` the hottest, ``devices`` per UUID; ``process_bytes`` is None (DCGM's
    default counters have no per-process memory).

    :param url: the Prometheus server, ``http(s)://HOST:PORT[/prefix]``.
    :param expected_devices: how many devices the run holds (the lease's); fewer series leave sums unknown.
    :raises ValueError: with neither a pod nor device UUIDs, or a name that is not a Kubernetes name.
    """

    source = "dcgm"

    def __init__(self, url: str, *, namespace: str | None = None, pod: str | None = None,
                 device_uuids: list[str] | None = None, expected_devices: int = 1, max_age_s: float = MAX_AGE_S):
        self.base = url.rstrip("/")
        self.shown = redact_url(self.base)
        names = "|".join(n.removeprefix("DCGM_FI_DEV_") for n in FIELDS)
        window = f"[{int(max_age_s)}s]"
        head = f'__name__=~"DCGM_FI_DEV_({names})"'
        if pod and namespace:
            self.what = f"pod {namespace}/{pod}"
            self.selectors = [f"{{{head},{prefix}namespace={_quoted(namespace)},{prefix}pod={_quoted(pod)}}}{window}"
                              for prefix in ("", "exported_")]
        elif device_uuids:
            self.what = f"device(s) {', '.join(device_uuids)}"
            bad = [u for u in device_uuids if not _UUID.fullmatch(u)]
            if bad:
                raise ValueError(f"{bad[0]!r} is not a device UUID")
            alternatives = "|".join(device_uuids)  # letters, digits and '-': no regex escape needed
            self.selectors = [f'{{{head},UUID=~"{alternatives}"}}{window}']
        else:
            raise ValueError("DcgmSampler needs a pod (namespace and pod) or device UUIDs")
        self.expected = max(1, int(expected_devices))
        self.max_age_s = max_age_s
        self.polls = self.without_series = self.unanswered = self.partial = 0
        self.last_error: str | None = None
        self._retry_at = 0.0

    def _rows(self, at: float) -> list[dict[str, Any]]:
        for selector in self.selectors:  # the exporter's own labels first, then as a scrape config renames them
            rows = query(self.base, selector, at, source=self.shown, what="GPU samples from Prometheus",
                         timeout_s=QUERY_TIMEOUT_S)
            if rows:
                return rows
        return []

    def _devices(self, rows: list[dict[str, Any]], at: float) -> dict[str, dict[str, float | None]]:
        """``{uuid: {field: newest fresh value}}`` (the busiest, when several series give one field)."""
        per: dict[str, dict[str, float | None]] = {}
        for row in rows:
            labels = row.get("metric") or {}
            what = FIELDS.get(labels.get("__name__", ""))
            values = row.get("values") or []
            if what is None or not values:
                continue
            ts, raw = values[-1]
            try:
                value, age = float(raw), at - float(ts)
            except (TypeError, ValueError):
                continue
            device = per.setdefault(labels.get("UUID") or f"gpu{labels.get('gpu', '?')}", {})
            if age <= self.max_age_s and math.isfinite(value) and value >= 0:  # NaN, +-Inf: not a reading
                device[what] = max(value, device.get(what) or value)
        return per

    def sample(self, now: float | None = None) -> dict[str, Any] | None:
        """One sample of the run's devices, or None when Prometheus did not answer or had no series for them."""
        at = time.time() if now is None else now
        self.polls += 1
        if time.monotonic() < self._retry_at:
            self.unanswered += 1
            return None
        try:
            rows = self._rows(at)
        except InventoryError as exc:
            self.unanswered += 1
            self.last_error = str(exc)
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            return None
        per = {uuid: d for uuid, d in self._devices(rows, at).items() if d}
        if not per:
            self.without_series += 1
            return None
        if len(per) < self.expected:
            self.partial += 1
        return _combine(per, complete=len(per) >= self.expected)

    @property
    def notes(self) -> list[str]:
        """What was not measured, and why (read by :meth:`autodl.metrics.Follower.summary`)."""
        out = []
        if self.unanswered:
            out.append(f"GPU samples of {self.what} unknown in {self.unanswered} of {self.polls} polls: "
                       f"Prometheus at {self.shown} did not answer ({self.last_error})")
        if self.without_series:
            out.append(f"GPU samples of {self.what} unknown in {self.without_series} of {self.polls} polls: Prometheus "
                       f"at {self.shown} had no fresh DCGM series for it (last {self.max_age_s:g} s; dcgm-exporter labels "
                       "a pod's GPUs only in its Kubernetes mode, DCGM_EXPORTER_KUBERNETES=true)")
        if self.partial:
            out.append(f"{self.partial} of {self.polls} GPU samples of {self.what} had series for fewer than its "
                       f"{self.expected} device(s): their summed memory and power are unknown")
        return out

    def close(self) -> None:
        """Nothing is held between polls."""


def _bytes(mib: float | None) -> int | None:
    return int(mib * MIB) if mib is not None else None


def _combine(per: dict[str, dict[str, float | None]], *, complete: bool) -> dict[str, Any]:
    """A sample from per-device fields (see :class:`DcgmSampler`); sums and means need every device."""
    devices = {uuid: {"used_bytes": _bytes(d.get("used_mib")),
                      "utilization_pct": d.get("utilization_pct"), "temperature_c": d.get("temperature_c"),
                      "power_w": d.get("power_w"), "process_bytes": None}
               for uuid, d in per.items()}

    def total(key: str) -> float | None:
        vals = [d[key] for d in devices.values()]
        return None if not complete or any(v is None for v in vals) else sum(v for v in vals if v is not None)

    utils = [d["utilization_pct"] for d in devices.values()]
    temps = [d["temperature_c"] for d in devices.values() if d["temperature_c"] is not None]
    known_utils = [u for u in utils if u is not None]
    return {
        "device_used_bytes": total("used_bytes"),
        "process_bytes": None,
        "others_bytes": None,
        "utilization_pct": (round(sum(known_utils) / len(known_utils), 2)
                            if complete and known_utils and len(known_utils) == len(utils) else None),
        "temperature_c": max(temps) if temps else None,
        "power_w": total("power_w"),
        "devices": devices,
    }
