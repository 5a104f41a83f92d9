"""A columnar index of one inventory snapshot (numpy arrays of the device fields placement reads), cached per ``Inventory``, and ``place``'s per-device pass on it.

:func:`indexed_partition` is a drop-in for :func:`autodl.policy.placement.partition` (``place(...,
partitioner=indexed_partition)``) that decides the same (``tests/simulate/test_place_index.py``) and pays off on
pools of 100,000 devices (``benchmarks/scheduling.py``'s latency table); the product's pools use the reference loop.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter

import numpy as np

from autodl.catalog import Catalog, GPUModel
from autodl.policy.placement import (
    MAX_KEPT_CANDIDATES,
    MAX_LOAD_PCT,
    Group,
    Partition,
    free_reasons,
    gang_reason,
    never_reason,
    partition,
    resolve_model,
    vendor_reason,
)
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

    @cached_property
    def position(self) -> dict[str, int] | None:
        """``device_id`` -> position, or None when ids repeat (then no incremental update)."""
        pos = {d: i for i, d in enumerate(self.device_ids)}
        return pos if len(pos) == len(self.device_ids) else None

    def updated(self, changed: "list[Device]") -> "InventoryIndex | None":
        """The index of this snapshot with ``changed`` devices (matched by ``device_id``) replaced,
        without re-reading the others: arrays copied and patched at the changed positions only.

        Only the live fields may change (memory used, utilization, health, and anything placement reads
        from the device objects themselves: vendor, index, NVLink group); a changed host, model or total
        memory, an unknown or repeated id, or a value the index cannot hold returns None (rebuild).

        :param changed: the new device records.
        :returns: the new index, equal to :func:`build_index` of the new device list, or None.
        """
        pos = self.position
        if pos is None:
            return None
        devices = list(self.devices)
        at: list[int] = []
        same_vendors = True
        for d in changed:
            i = pos.get(d.device_id)
            if i is None:
                return None
            old = devices[i]
            if d.host != old.host or d.model != old.model or d.memory_total_bytes != old.memory_total_bytes:
                return None
            same_vendors = same_vendors and d.vendor == old.vendor
            devices[i] = d
            at.append(i)
        if not at:
            return self._carry(dataclasses.replace(self, devices=devices), same_vendors)
        try:
            used = np.fromiter((devices[i].memory_used_bytes for i in at), np.int64, len(at))
            util = np.fromiter((devices[i].utilization_pct for i in at), np.float64, len(at))
            healthy = np.fromiter((devices[i].healthy for i in at), np.bool_, len(at))
        except (OverflowError, TypeError, ValueError):
            return None
        if np.abs(used).max() >= INT_LIMIT or np.isnan(util).any():
            return None
        idx = np.asarray(at, dtype=np.intp)
        free = self.memory_free_bytes.copy()
        free[idx] = self.memory_total_bytes[idx] - used
        util_a = self.utilization_pct.copy()
        util_a[idx] = util
        healthy_a = self.healthy.copy()
        healthy_a[idx] = healthy
        return self._carry(dataclasses.replace(self, devices=devices, memory_free_bytes=free, utilization_pct=util_a,
                                               healthy=healthy_a), same_vendors)

    def _carry(self, new: "InventoryIndex", same_vendors: bool) -> "InventoryIndex":
        """Hand the lazily built id map (ids do not change) and vendor codes (when no vendor changed) on."""
        if "position" in self.__dict__:
            new.__dict__["position"] = self.__dict__["position"]
        if same_vendors and "vendor_codes" in self.__dict__:
            new.__dict__["vendor_codes"] = self.__dict__["vendor_codes"]
        return new

    def mask(self, device_ids: frozenset[str] | set[str]) -> np.ndarray:
        """Boolean array: which devices have an id in ``device_ids`` (e.g. the leased ones).

        One set look-up per device, or, when ``device_ids`` is small against the pool and the ids are
        unique, one position look-up per given id (the id -> position map is built once per index).
        """
        n = len(self.device_ids)
        if not device_ids:
            return np.zeros(n, dtype=np.bool_)
        if 8 * len(device_ids) < n and ("position" in self.__dict__ or n > 4096):
            pos = self.position            # unique ids: look the few given ids up instead
            if pos is not None:
                out = np.zeros(n, dtype=np.bool_)
                hits = [i for i in map(pos.get, device_ids) if i is not None]
                out[hits] = True
                return out
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
    _remember(inventory, index)
    return index


def _remember(inventory: Inventory, index: InventoryIndex | None) -> None:
    key = id(inventory)
    _CACHE[key] = (weakref.ref(inventory, functools.partial(_drop, key)), index)


def apply_changes(inventory: Inventory, changed: "list[Device]") -> Inventory:
    """A new snapshot: ``inventory`` with the ``changed`` devices (matched by ``device_id``) replaced,
    whose index is derived from ``inventory``'s by patching the changed positions
    (:meth:`InventoryIndex.updated`) instead of re-reading every device -- what a scheduler that keeps
    its pool snapshot and hears of a few changes (a lease, a utilization sample) calls. When the change
    cannot be patched (a new device, a changed model or total memory) the new snapshot is indexed
    from scratch on first use. ``inventory`` itself is not modified.

    :param inventory: the current snapshot.
    :param changed: new records of some of its devices (a record with a new id is appended).
    :returns: the new snapshot (a new ``Inventory``; its ``devices`` is a new list).
    """
    old = inventory_index(inventory)
    by_id = {d.device_id: d for d in changed}
    if old is not None:
        new_index = old.updated(list(by_id.values()))
        if new_index is not None:
            new = inventory.model_copy(update={"devices": new_index.devices})
            _remember(new, new_index)
            return new
    known = {d.device_id for d in inventory.devices}
    devices = [by_id.get(d.device_id, d) for d in inventory.devices]
    devices += [d for d in by_id.values() if d.device_id not in known]
    return inventory.model_copy(update={"devices": devices})


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


@dataclass
class _Models:
    """Per model spelling of one index: its catalog entry (or the effective model of its first device) and name;
    names are coded in order of first appearance."""

    gpus: list[GPUModel | None]
    names: list[str]
    cm_of_raw: np.ndarray
    """name code of each model spelling"""
    cmodels: list[str]
    """the names, by code"""
    dev_cm: np.ndarray
    """name code of each device"""


def _models(idx: InventoryIndex, catalog: Catalog) -> _Models:
    """Look up each distinct model spelling in the catalog once."""
    _, first_of_model = np.unique(idx.model_code, return_index=True)
    gpus = [resolve_model(m, idx.devices[int(first_of_model[i])], catalog) for i, m in enumerate(idx.models)]
    names = [g.name if g is not None else m for g, m in zip(gpus, idx.models)]
    name_code: dict[str, int] = {}
    cm_of_raw = np.array([name_code.setdefault(nm, len(name_code)) for nm in names], dtype=np.intp)
    return _Models(gpus, names, cm_of_raw, list(name_code), cm_of_raw[idx.model_code])


def _kinds(idx: InventoryIndex, models: _Models) -> tuple[np.ndarray, list[tuple[int, str | None, int]]]:
    """Per device its kind's code, and per kind (model spelling, its devices' vendor or None, memory). A device's own
    vendor counts only when the catalog lacks its model (Device.vendor defaults to nvidia), so only such kinds are
    split by the devices' vendors."""
    gpus = models.gpus
    kind_code = idx.kind_code
    kinds: list[tuple[int, str | None, int]] = [(mc, None, total) for mc, total in idx.kinds]
    unknown = np.array([gpus[mc] is None for mc, _ in idx.kinds], dtype=np.bool_)
    if unknown.any():
        vendors, vcode = idx.vendor_codes
        kind_code, first = first_appearance_codes(
            idx.kind_code * (len(vendors) + 1) + np.where(unknown[idx.kind_code], vcode + 1, 0))
        kinds = []
        for i in first.tolist():
            mc, total = idx.kinds[idx.kind_code[i]]
            kinds.append((mc, vendors[vcode[i]] if gpus[mc] is None else None, total))
    return kind_code, kinds


@dataclass
class _DroppedKeys:
    """Dropped keys, coded through one dict of (model, reason) so that equal pairs share a code."""

    keys: dict[tuple[str, str], int]
    kind_key: np.ndarray
    """per kind, its dropped key when the vendor is not allowed or the run never fits, else -1"""
    kind_vendor: list[str]
    reason_key: np.ndarray
    """[model code, r]: dropped key of reason r of free_reasons; column 4 = free now (-1)"""


def _dropped_keys(kinds: list[tuple[int, str | None, int]], models: _Models, allowed: set[str], threshold: float,
                  need: int) -> _DroppedKeys:
    """Decide vendor and never-fits once per kind, and code the not-free-now reasons of the models that fit."""
    keys: dict[tuple[str, str], int] = {}
    kind_key = np.full(len(kinds), -1, dtype=np.intp)
    kind_vendor: list[str] = []
    fit_models: set[int] = set()
    for k, (mc, own_vendor, total) in enumerate(kinds):
        gpu, model = models.gpus[mc], models.names[mc]
        vendor = gpu.vendor if gpu is not None else own_vendor
        if vendor is None:  # _kinds gives a kind of a model the catalog lacks its devices' vendor
            raise RuntimeError(f"device model {model!r} has no vendor in the index")
        kind_vendor.append(vendor)
        if vendor not in allowed:
            reason = vendor_reason(vendor, allowed)
        elif need > threshold * total:
            reason = never_reason(need, threshold, total)
        else:
            fit_models.add(int(models.cm_of_raw[mc]))
            continue
        kind_key[k] = keys.setdefault((model, reason), len(keys))
    reason_key = np.full((len(models.cmodels), 5), -1, dtype=np.intp)
    for cm in sorted(fit_models):
        for col, text in enumerate(free_reasons(need)):
            reason_key[cm, col] = keys.setdefault((models.cmodels[cm], text), len(keys))
    return _DroppedKeys(keys, kind_key, kind_vendor, reason_key)


def _device_checks(idx: InventoryIndex, kind_code: np.ndarray, dk: _DroppedKeys, dev_cm: np.ndarray, need: int,
                   leased: frozenset[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per device: could it ever hold the run, is it free now, and its dropped key (the first failing check, as
    in the reference loop: later assignments win)."""
    fit = (dk.kind_key < 0)[kind_code]
    reason = np.full(len(idx.devices), 4, dtype=np.intp)
    reason[need > idx.memory_free_bytes] = 3
    reason[idx.utilization_pct > MAX_LOAD_PCT] = 2
    if leased:
        reason[idx.mask(leased)] = 1
    reason[~idx.healthy] = 0
    avail = fit & (reason == 4)
    dkey = np.where(fit, dk.reason_key[dev_cm, reason], dk.kind_key[kind_code])
    return fit, avail, dkey


@dataclass
class _FitGroups:
    """Groups (host, model) of the devices that could ever hold the run, numbered by first appearance."""

    gfirst: np.ndarray
    """first device of each group"""
    ngroups: int
    nfit: np.ndarray
    """devices per group that could ever hold the run"""
    navail: np.ndarray
    """free devices per group"""
    apos: np.ndarray
    """free devices, by group, pool order inside"""
    astart: np.ndarray
    """where each group's free devices start in apos"""


def _fit_groups(idx: InventoryIndex, fpos: np.ndarray, avail: np.ndarray, models: _Models) -> _FitGroups:
    g_of_f, first = first_appearance_codes(idx.host_code[fpos] * len(models.cmodels) + models.dev_cm[fpos])
    gfirst = fpos[first]                       # first device of each group; g_of_f: group of each
    ngroups = gfirst.size
    nfit = np.bincount(g_of_f, minlength=ngroups)
    favail = avail[fpos]
    ag = g_of_f[favail]
    navail = np.bincount(ag, minlength=ngroups)
    apos = fpos[favail][np.argsort(ag, kind="stable")]   # free devices, by group, pool order inside
    astart = np.concatenate(([0], np.cumsum(navail)[:-1]))
    return _FitGroups(gfirst, ngroups, nfit, navail, apos, astart)


def _gang_misfits(idx: InventoryIndex, fg: _FitGroups, models: _Models, n: int) -> list[tuple[str, str, np.ndarray]]:
    """Gangs that do not fit a host, grouped per (model, never/not now) in order of first appearance: (model,
    reason, device positions)."""
    gang: list[tuple[str, str, np.ndarray]] = []
    nfit, navail, gfirst = fg.nfit, fg.navail, fg.gfirst
    gs = np.flatnonzero(((nfit < n) | (navail < n)) & (navail > 0))
    if not gs.size:
        return gang
    never = nfit[gs] < n
    gmc = models.dev_cm[gfirst[gs]]
    kcode, kfirst = first_appearance_codes(gmc * 2 + never)
    val = np.where(never, nfit[gs], navail[gs])
    lens = navail[gs]
    ends = np.cumsum(lens)
    elem = np.repeat(fg.astart[gs] - (ends - lens), lens) + np.arange(int(ends[-1]))
    elem_kind = np.repeat(kcode, lens)
    by_kind = fg.apos[elem][np.argsort(elem_kind, kind="stable")]
    bounds = np.concatenate(([0], np.cumsum(np.bincount(elem_kind, minlength=kfirst.size))))
    for k, f in enumerate(kfirst.tolist()):
        vk = val[kcode == k]
        host = idx.hosts[idx.host_code[gfirst[gs[f]]]]
        why = gang_reason(n, bool(never[f]), int(vk.size), int(vk.min()), int(vk.max()), host)
        gang.append((models.cmodels[gmc[f]], why, by_kind[bounds[k]:bounds[k + 1]]))
    return gang


def _kept_candidates(idx: InventoryIndex, fg: _FitGroups, models: _Models, ready_g: np.ndarray, n: int) -> np.ndarray:
    """The ready groups worth scoring: within one device model every term but load is equal, so only the
    least-loaded MAX_KEPT_CANDIDATES device sets of each model can rank among the best ones."""
    gcm = models.dev_cm[fg.gfirst[ready_g]]
    counts = np.bincount(gcm, minlength=len(models.cmodels))
    if not (counts > MAX_KEPT_CANDIDATES).any():
        return ready_g
    if n == 1:
        lowest = np.full(fg.ngroups, np.inf)
        has = fg.navail > 0
        lowest[has] = np.minimum.reduceat(idx.utilization_pct[fg.apos], fg.astart[has])
    parts = [ready_g[np.isin(gcm, np.flatnonzero(counts <= MAX_KEPT_CANDIDATES))]]
    for cm in np.flatnonzero(counts > MAX_KEPT_CANDIDATES).tolist():
        gs = ready_g[gcm == cm]
        if n == 1:
            gs = gs[np.lexsort((gs, lowest[gs]))]
        parts.append(gs[:MAX_KEPT_CANDIDATES])
    return np.sort(np.concatenate(parts))


def _ready_groups(idx: InventoryIndex, fg: _FitGroups, models: _Models, kind_code: np.ndarray,
                  kind_vendor: list[str], ready_g: np.ndarray, n: int) -> list[Group]:
    """The kept groups, with their free devices (touching Device objects only for these), and for one device the
    set _choose_set would choose."""
    at = fg.gfirst[ready_g]
    ready = [
        Group(idx.hosts[h], models.names[mc], kind_vendor[k], models.gpus[mc], g, nf)
        for g, h, mc, k, nf in zip(ready_g.tolist(), idx.host_code[at].tolist(), idx.model_code[at].tolist(),
                                   kind_code[at].tolist(), fg.nfit[ready_g].tolist())
    ]
    # the kept groups' free devices, by group, pool order inside
    ag_sorted = np.repeat(np.arange(fg.ngroups), fg.navail)
    kept = np.zeros(fg.ngroups, dtype=np.bool_)
    kept[ready_g] = True
    sel = kept[ag_sorted]
    kp, kg = fg.apos[sel], ag_sorted[sel]
    kept_devices = list(map(idx.devices.__getitem__, kp.tolist()))
    end = 0
    for grp, m in zip(ready, fg.navail[ready_g].tolist()):
        grp.available = kept_devices[end:end + m]
        end += m
    if n == 1:
        _choose_one_device(idx, ready, kept_devices, kp, kg)
    return ready


def _choose_one_device(idx: InventoryIndex, ready: list[Group], kept_devices: list[Device], kp: np.ndarray,
                       kg: np.ndarray) -> None:
    """_choose_set for one device: the least loaded, then most free memory, then lowest index; ties go to pool
    order (lexsort is stable and kp is in pool order per group)."""
    try:    # Device.index is read here, for the kept groups' devices only
        on_host = np.fromiter((d.index for d in kept_devices), np.int64, len(kept_devices))
    except OverflowError:   # an index beyond int64: _choose_set decides
        return
    o = np.lexsort((on_host, -np.maximum(idx.memory_free_bytes[kp], 0), idx.utilization_pct[kp], kg))
    kg_o = kg[o]
    best = o[np.concatenate(([True], kg_o[1:] != kg_o[:-1]))].tolist()   # one per kept group
    for grp, b in zip(ready, best):
        grp.chosen = ([kept_devices[b]], False, None)


def _dropped_sets(idx: InventoryIndex, dkey: np.ndarray, keys: dict[tuple[str, str], int],
                  gang: list[tuple[str, str, np.ndarray]]) -> list[tuple[str, str, list[str], str]]:
    """Dropped sets: per-device keys in order of first appearance, then the gang groups in group order."""
    dropped_pos: dict[tuple[str, str], list[np.ndarray]] = {}
    dpos = np.flatnonzero(dkey >= 0)
    if dpos.size:
        kd = dkey[dpos]
        kr, kfirst = first_appearance_codes(kd)
        sorted_pos = dpos[np.argsort(kr, kind="stable")]
        key_of_code = list(keys)
        start = 0
        for code, end in zip(kd[kfirst].tolist(), np.cumsum(np.bincount(kr)).tolist()):
            dropped_pos[key_of_code[code]] = [sorted_pos[start:end]]
            start = end
    for model, why, pos in gang:
        dropped_pos.setdefault((model, why), []).append(pos)
    dropped: list[tuple[str, str, list[str], str]] = []
    for (model, reason), chunks in dropped_pos.items():
        pos = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        if not pos.size:
            continue
        hc = idx.host_code[pos]
        host = idx.hosts[hc[0]] if (hc == hc[0]).all() else "*"
        dropped.append((model, reason, list(map(idx.device_ids.__getitem__, pos.tolist())), host))
    return dropped


def indexed_partition(inventory: Inventory, catalog: Catalog, allowed: set[str], threshold: float, need: int, n: int,
                      leased: frozenset[str]) -> Partition:
    """Sort the pool's devices into groups and dropped sets, on the inventory's cached columnar index.

    Same result as :func:`autodl.policy.placement.partition` (``tests/simulate/test_place_index.py`` checks it
    on random pools), which it falls back to when the inventory cannot be indexed exactly. Per call it
    looks up each distinct model spelling in the catalog once, decides vendor and never-fits once per
    distinct (model, memory) kind (split by the devices' own vendor for models the catalog lacks),
    tests health, leases, load and free memory on arrays, and touches :class:`Device` objects only for
    the groups it keeps for scoring.
    """
    idx = inventory_index(inventory)
    if idx is None or not -INT_LIMIT < need < INT_LIMIT or any(d.health_reason for d in idx.devices):
        return partition(inventory, catalog, allowed, threshold, need, n, leased)
    models = _models(idx, catalog)
    kind_code, kinds = _kinds(idx, models)
    dk = _dropped_keys(kinds, models, allowed, threshold, need)
    fit, avail, dkey = _device_checks(idx, kind_code, dk, models.dev_cm, need, leased)
    fpos = np.flatnonzero(fit)
    ready: list[Group] = []
    gang: list[tuple[str, str, np.ndarray]] = []
    fits = False
    total_ready = 0
    if fpos.size:
        fg = _fit_groups(idx, fpos, avail, models)
        fits = bool((fg.nfit >= n).any())
        ready_g = np.flatnonzero(fg.navail >= n)
        total_ready = int(ready_g.size)
        if n > 1:
            gang = _gang_misfits(idx, fg, models, n)
        ready_g = _kept_candidates(idx, fg, models, ready_g, n)
        if ready_g.size:
            ready = _ready_groups(idx, fg, models, kind_code, dk.kind_vendor, ready_g, n)
    return Partition(fits, total_ready, ready, _dropped_sets(idx, dkey, dk.keys, gang))
