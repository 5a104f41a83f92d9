"""A columnar index of one inventory snapshot (numpy arrays of the device fields placement reads), built once per ``Inventory`` and cached."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter

import numpy as np

from autodl.types import Device, Inventory

INT_LIMIT = 2**62
"""Byte counts at or beyond this magnitude are not indexed: ``memory_total_bytes - memory_used_bytes``
must not overflow int64. No real device comes near (2**62 bytes is 4 EiB)."""


@dataclass(frozen=True, eq=False)
class InventoryIndex:
    """The fields of an inventory's devices as arrays in pool order (position ``i`` is ``devices[i]``).

    Strings are coded: ``host_code[i]`` indexes ``hosts``, ``model_code[i]`` indexes ``models`` (the
    devices' own ``model`` spelling, before any catalog look-up); each list is in order of first
    appearance. A *kind* is one (model, memory_total_bytes) combination: ``kind_code[i]`` indexes
    ``kinds``, whose entries are (model code, memory_total_bytes), in order of first appearance.
    ``Device.vendor`` is read only on demand (:attr:`vendor_codes`).

    :ivar devices: the inventory's device list itself (not a copy).
    :ivar device_ids: ``device_id`` per device.
    :ivar memory_total_bytes: int64, bytes.
    :ivar memory_free_bytes: int64, ``memory_total_bytes - memory_used_bytes`` in bytes, *not* clamped
        at 0 (unlike :attr:`autodl.types.Device.memory_free_bytes`).
    :ivar utilization_pct: float64, percent; never NaN.
    :ivar healthy: bool.
    """

    devices: list[Device]
    device_ids: list[str]
    hosts: list[str]
    host_code: np.ndarray
    models: list[str]
    model_code: np.ndarray
    memory_total_bytes: np.ndarray
    memory_free_bytes: np.ndarray
    utilization_pct: np.ndarray
    healthy: np.ndarray
    kinds: list[tuple[int, int]]
    kind_code: np.ndarray

    @cached_property
    def vendor_codes(self) -> tuple[list[str], np.ndarray]:
        """(``Device.vendor`` values in order of first appearance, each device's code), read on first use:
        placement needs a device's own vendor only for models the catalog lacks."""
        return _encode([d.vendor for d in self.devices])

    def mask(self, device_ids: frozenset[str] | set[str]) -> np.ndarray:
        """Boolean array: which devices have an id in ``device_ids`` (e.g. the leased ones).

        One set look-up per device and no id -> position dict to build: cheapest for a snapshot used
        once, and right when ids repeat.
        """
        n = len(self.device_ids)
        if not device_ids:
            return np.zeros(n, dtype=np.bool_)
        return np.fromiter(map(device_ids.__contains__, self.device_ids), np.bool_, n)


# id(inventory) -> (weak reference to it, its index or None when it cannot be indexed)
_CACHE: dict[int, tuple[weakref.ref, InventoryIndex | None]] = {}


def inventory_index(inventory: Inventory) -> InventoryIndex | None:
    """The index of ``inventory``, built on the first call for that object and cached until it is
    garbage-collected.

    What is cached: one :class:`InventoryIndex` per live ``Inventory`` object, keyed by identity, held
    through a weak reference (the cache never keeps an inventory alive; its entry goes when the
    inventory does). A new snapshot, a ``model_copy`` or a re-read inventory is a new object and gets
    its own index. Nothing in the index depends on the catalog, the profile, the resource policy or
    the leases; callers apply those per call.

    When the cache is invalid: ``Inventory`` and ``Device`` are frozen, but ``Inventory.devices`` is a
    plain list; mutating that list in place (append, item assignment) after the first call makes the
    index stale. A changed length is detected and the index is rebuilt; a same-length in-place
    replacement is not. Nothing in autodl mutates an inventory's list; treat it as immutable.

    :param inventory: the pool snapshot.
    :returns: the index, or ``None`` when the inventory cannot be indexed exactly (a byte count at or
        beyond :data:`INT_LIMIT`, a NaN utilization, or a device lacking a field); callers then use the
        device objects directly.
    """
    key = id(inventory)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is inventory and (hit[1] is None or len(hit[1].devices) == len(inventory.devices)):
        return hit[1]
    index = build_index(inventory)
    _CACHE[key] = (weakref.ref(inventory, lambda _ref, key=key: _drop(key, _ref)), index)
    return index


def _drop(key: int, ref: weakref.ref) -> None:
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is ref:
        del _CACHE[key]


def _encode(values: list) -> tuple[list, np.ndarray]:
    """Distinct values in order of first appearance, and each value's position among them."""
    first = dict.fromkeys(values)
    if len(first) == 1:                          # one host, one model or one vendor: all zeros
        return list(first), np.zeros(len(values), dtype=np.intp)
    code = {v: i for i, v in enumerate(first)}
    return list(first), np.fromiter(map(code.__getitem__, values), np.intp, len(values))


def first_appearance_codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Number the distinct values of ``keys`` in order of first appearance.

    :param keys: 1-D integer array.
    :returns: (code of each element, position of each code's first element); codes are 0..k-1 and
        the positions ascend.
    """
    _, first, raw = np.unique(keys, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    rank = np.empty_like(by_first)
    rank[by_first] = np.arange(by_first.size)
    return rank[raw.reshape(-1)], first[by_first]


def build_index(inventory: Inventory) -> InventoryIndex | None:
    """Build (without caching) the index of ``inventory``; see :func:`inventory_index`.

    :param inventory: the pool snapshot.
    :returns: the index, or ``None`` when it cannot be indexed exactly.
    """
    devices = inventory.devices
    n = len(devices)
    try:
        # pydantic keeps a model's field values in its __dict__; reading them there is ~2x faster than
        # attribute access, which matters at 10,000 devices.
        rows = [d.__dict__ for d in devices]
        ids, hosts, models = (list(map(itemgetter(f), rows)) for f in ("device_id", "host", "model"))
        total_a = np.fromiter(map(itemgetter("memory_total_bytes"), rows), np.int64, n)
        used_a = np.fromiter(map(itemgetter("memory_used_bytes"), rows), np.int64, n)
        util_a = np.fromiter(map(itemgetter("utilization_pct"), rows), np.float64, n)
        healthy_a = np.fromiter(map(itemgetter("healthy"), rows), np.bool_, n)
    except (KeyError, AttributeError, OverflowError, TypeError, ValueError):
        return None
    if n and (
        np.abs(total_a).max() >= INT_LIMIT or np.abs(used_a).max() >= INT_LIMIT or np.isnan(util_a).any()
    ):
        return None
    host_names, host_code = _encode(hosts)
    model_names, model_code = _encode(models)
    # kind = (model, memory_total_bytes), coded in order of first appearance: one sort of
    # total x models + model when that fits in int64, else memory sizes coded first.
    span = max(1, len(model_names))
    if not n or (total_a.min() >= 0 and total_a.max() < INT_LIMIT // span):
        key = total_a * span + model_code
    else:
        _, total_code = np.unique(total_a, return_inverse=True)
        key = total_code.reshape(-1).astype(np.int64) * span + model_code
    kind_code, first = first_appearance_codes(key)
    kinds = [(int(model_code[i]), int(total_a[i])) for i in first.tolist()]
    return InventoryIndex(
        devices=devices, device_ids=ids,
        hosts=host_names, host_code=host_code,
        models=model_names, model_code=model_code,
        memory_total_bytes=total_a, memory_free_bytes=total_a - used_a,
        utilization_pct=util_a, healthy=healthy_a,
        kinds=kinds, kind_code=kind_code,
    )
