"""A columnar index of one inventory snapshot (numpy arrays of the device fields placement reads), cached per ``Inventory``, and ``place``'s per-device pass on it.

:func:`indexed_partition` is a drop-in for :func:`autodl.policy.placement.partition` (``place(...,
partitioner=indexed_partition)``) that decides the same (``tests/simulate/test_place_index.py``) and pays off on
pools of 100,000 devices (``benchmarks/scheduling.py``'s latency table); the product's pools use the reference loop.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter

import numpy as np

from autodl.catalog import Catalog
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
    _CACHE[key] = (weakref.ref(inventory, lambda _ref, key=key: _drop(key, _ref)), index)


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
    ndev = len(idx.devices)

    # Per model spelling: catalog entry (or the effective model of its first device) and name; names
    # are coded in order of first appearance.
    _, first_of_model = np.unique(idx.model_code, return_index=True)
    gpus = [resolve_model(m, idx.devices[int(first_of_model[i])], catalog) for i, m in enumerate(idx.models)]
    names = [g.name if g is not None else m for g, m in zip(gpus, idx.models)]
    name_code: dict[str, int] = {}
    cm_of_raw = np.array([name_code.setdefault(nm, len(name_code)) for nm in names], dtype=np.intp)
    cmodels = list(name_code)
    dev_cm = cm_of_raw[idx.model_code]

    # Per kind (model spelling, memory): vendor, and the dropped key when the vendor is not allowed or
    # the run never fits. A device's own vendor counts only when the catalog lacks its model
    # (Device.vendor defaults to nvidia), so only such kinds are split by the devices' vendors.
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
    # Dropped keys are coded through one dict of (model, reason), so equal pairs share a code.
    keys: dict[tuple[str, str], int] = {}
    kind_key = np.full(len(kinds), -1, dtype=np.intp)
    kind_vendor: list[str] = []
    fit_models: set[int] = set()
    for k, (mc, own_vendor, total) in enumerate(kinds):
        gpu, model = gpus[mc], names[mc]
        vendor = gpu.vendor if gpu is not None else own_vendor
        kind_vendor.append(vendor)
        if vendor not in allowed:
            reason = vendor_reason(vendor, allowed)
        elif need > threshold * total:
            reason = never_reason(need, threshold, total)
        else:
            fit_models.add(int(cm_of_raw[mc]))
            continue
        kind_key[k] = keys.setdefault((model, reason), len(keys))
    kind_fit = kind_key < 0
    # reason_key[model code, r]: dropped key of reason r of _free_reasons; column 4 = free now (-1)
    reason_key = np.full((len(cmodels), 5), -1, dtype=np.intp)
    for cm in sorted(fit_models):
        for r, text in enumerate(free_reasons(need)):
            reason_key[cm, r] = keys.setdefault((cmodels[cm], text), len(keys))

    # Per device: the first failing check, as in the reference loop (later assignments win).
    fit = kind_fit[kind_code]
    r = np.full(ndev, 4, dtype=np.intp)
    r[need > idx.memory_free_bytes] = 3
    r[idx.utilization_pct > MAX_LOAD_PCT] = 2
    if leased:
        r[idx.mask(leased)] = 1
    r[~idx.healthy] = 0
    avail = fit & (r == 4)
    dkey = np.where(fit, reason_key[dev_cm, r], kind_key[kind_code])

    # Groups: (host, model) of devices that could ever hold the run, numbered by first appearance.
    fpos = np.flatnonzero(fit)
    ready: list[Group] = []
    gang: list[tuple[str, str, np.ndarray]] = []
    fits = False
    total_ready = 0
    if fpos.size:
        g_of_f, first = first_appearance_codes(idx.host_code[fpos] * len(cmodels) + dev_cm[fpos])
        gfirst = fpos[first]                       # first device of each group; g_of_f: group of each
        ngroups = gfirst.size
        nfit = np.bincount(g_of_f, minlength=ngroups)
        favail = avail[fpos]
        ag = g_of_f[favail]
        navail = np.bincount(ag, minlength=ngroups)
        apos = fpos[favail][np.argsort(ag, kind="stable")]   # free devices, by group, pool order inside
        astart = np.concatenate(([0], np.cumsum(navail)[:-1]))
        fits = bool((nfit >= n).any())
        ready_g = np.flatnonzero(navail >= n)
        total_ready = int(ready_g.size)

        def groups_of(gs: np.ndarray) -> list[Group]:
            """The groups numbered ``gs``, without their devices."""
            at = gfirst[gs]
            return [
                Group(idx.hosts[h], names[mc], kind_vendor[k], gpus[mc], g, nf)
                for g, h, mc, k, nf in zip(gs.tolist(), idx.host_code[at].tolist(), idx.model_code[at].tolist(),
                                           kind_code[at].tolist(), nfit[gs].tolist())
            ]

        if n > 1:
            # gangs that do not fit a host, grouped per (model, never/not now) in order of first appearance
            gs = np.flatnonzero(((nfit < n) | (navail < n)) & (navail > 0))
            if gs.size:
                never = nfit[gs] < n
                gmc = dev_cm[gfirst[gs]]
                kcode, kfirst = first_appearance_codes(gmc * 2 + never)
                val = np.where(never, nfit[gs], navail[gs])
                lens = navail[gs]
                ends = np.cumsum(lens)
                elem = np.repeat(astart[gs] - (ends - lens), lens) + np.arange(int(ends[-1]))
                elem_kind = np.repeat(kcode, lens)
                by_kind = apos[elem][np.argsort(elem_kind, kind="stable")]
                bounds = np.concatenate(([0], np.cumsum(np.bincount(elem_kind, minlength=kfirst.size))))
                for k, f in enumerate(kfirst.tolist()):
                    vk = val[kcode == k]
                    host = idx.hosts[idx.host_code[gfirst[gs[f]]]]
                    why = gang_reason(n, bool(never[f]), int(vk.size), int(vk.min()), int(vk.max()), host)
                    gang.append((cmodels[gmc[f]], why, by_kind[bounds[k]:bounds[k + 1]]))
        # Within one device model every term but load is equal, so only the least-loaded
        # MAX_KEPT_CANDIDATES device sets of each model can rank among the best ones.
        gcm = dev_cm[gfirst[ready_g]]
        counts = np.bincount(gcm, minlength=len(cmodels))
        if (counts > MAX_KEPT_CANDIDATES).any():
            if n == 1:
                lowest = np.full(ngroups, np.inf)
                has = navail > 0
                lowest[has] = np.minimum.reduceat(idx.utilization_pct[apos], astart[has])
            parts = [ready_g[np.isin(gcm, np.flatnonzero(counts <= MAX_KEPT_CANDIDATES))]]
            for cm in np.flatnonzero(counts > MAX_KEPT_CANDIDATES).tolist():
                gs = ready_g[gcm == cm]
                if n == 1:
                    gs = gs[np.lexsort((gs, lowest[gs]))]
                parts.append(gs[:MAX_KEPT_CANDIDATES])
            ready_g = np.sort(np.concatenate(parts))
        if ready_g.size:
            ready = groups_of(ready_g)
            # the kept groups' free devices, by group, pool order inside
            ag_sorted = np.repeat(np.arange(ngroups), navail)
            kept = np.zeros(ngroups, dtype=np.bool_)
            kept[ready_g] = True
            sel = kept[ag_sorted]
            kp, kg = apos[sel], ag_sorted[sel]
            kept_devices = list(map(idx.devices.__getitem__, kp.tolist()))
            end = 0
            for grp, m in zip(ready, navail[ready_g].tolist()):
                grp.available = kept_devices[end:end + m]
                end += m
            if n == 1:
                # _choose_set for one device: the least loaded, then most free memory, then lowest
                # index; ties go to pool order (lexsort is stable and kp is in pool order per group).
                try:    # Device.index is read here, for the kept groups' devices only
                    on_host = np.fromiter((d.index for d in kept_devices), np.int64, len(kept_devices))
                except OverflowError:   # an index beyond int64: _choose_set decides
                    pass
                else:
                    o = np.lexsort((on_host, -np.maximum(idx.memory_free_bytes[kp], 0), idx.utilization_pct[kp], kg))
                    kg_o = kg[o]
                    best = o[np.concatenate(([True], kg_o[1:] != kg_o[:-1]))].tolist()   # one per kept group
                    for grp, b in zip(ready, best):
                        grp.chosen = ([kept_devices[b]], False, None)

    # Dropped sets: per-device keys in order of first appearance, then the gang groups in group order.
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
    return Partition(fits, total_ready, ready, dropped)
