"""``place`` on the simulator's cached columnar inventory index decides exactly as the product's per-device loop."""

from __future__ import annotations

import gc
import json
import math
import random

import pytest

from autodl.policy import place, registry
from autodl.policy.base import Need, Scored
from autodl.spec import ResourcePolicySection
from autodl.types import Device, Inventory, MemoryBreakdown, ResourceProfile
from autodl_sim import baselines  # noqa: F401 - registers the baselines
from autodl_sim import inventory_index as module
from autodl_sim.inventory_index import apply_changes, build_index, indexed_partition, inventory_index

pytestmark = pytest.mark.simulator

GIB = 2**30
MIB = 2**20

# Spellings as an inventory may carry them: catalog names, NVML aliases of the same model (merged into
# one group on a host), other vendors, a model the catalog lacks, one without a list price.
MODELS = ["A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "T4", "V100-PCIE-32GB", "A100-SXM4-80GB",
          "H200-SXM-141GB", "Ascend-910", "Kunlun-R200", "Mystery-GPU"]
UTILS = [0.0, 0.0, 5.0, 10.0, 50.0, 90.0, 90.5, 100.0]   # repeated values: ties on load


def prof(peak_bytes: int, num_gpus: int) -> ResourceProfile:
    return ResourceProfile(
        script="train.py", params=1_000_000, peak_memory_bytes=peak_bytes,
        breakdown=MemoryBreakdown(weights_bytes=4_000_000, activations_bytes=max(0, peak_bytes - 4_000_000)),
        flops_per_step=2e11, batch_size=32, num_gpus=num_gpus,
    )


def random_pool(catalog, rng: random.Random, size: int = 500) -> Inventory:
    """``size`` devices on hosts of 1-8 devices: mixed models, some MIG-like odd memory sizes, memory
    used beyond the total, busy and unhealthy devices, NVLink groups on some hosts."""
    devices: list[Device] = []
    host = 0
    while len(devices) < size:
        per_host = rng.randint(1, 8)
        host_models = rng.sample(MODELS, rng.randint(1, 2))
        nvlink = rng.random() < 0.4
        for idx in range(min(per_host, size - len(devices))):
            spelling = rng.choice(host_models)
            gpu = catalog.find(spelling)
            total = gpu.memory_bytes if gpu else rng.choice([16, 24]) * GIB
            if rng.random() < 0.1:
                total += rng.choice([-3, 5, 40]) * MIB            # rounds to the same GiB, or not
            used = rng.choice([0, 0, GIB, rng.randrange(total), total + GIB])
            util = rng.choice(UTILS) if rng.random() < 0.8 else rng.uniform(0, 100)
            devices.append(Device(
                device_id=f"n{host}:{idx}", host=f"n{host}", index=rng.choice([idx, 0, per_host - idx]), model=spelling,
                vendor=rng.choice(["nvidia", "amd"]) if gpu is None else gpu.vendor,
                memory_total_bytes=total, memory_used_bytes=used, utilization_pct=util,
                healthy=rng.random() > 0.08, declared=True,
                nvlink_group=f"n{host}-nv{idx // rng.choice([2, 4])}" if nvlink else None,
            ))
        host += 1
    return Inventory(source="test", declared=True, devices=devices)


class OptionsProbe:
    """A policy that records the options it is given (every field a policy can see) and scores by order."""

    name = "options_probe"
    headroom = True
    queue = "backfill"

    def __init__(self, seen: list):
        self.seen = seen

    def score(self, need: Need, options, ctx) -> list[Scored]:
        self.seen.append((need, list(options)))
        return [Scored(-float(o.order), {"order": -float(o.order)}) for o in options]


def both(prf, inventory, **kw):
    """(indexed decision, reference decision) as JSON text (NaN loads compare equal as text)."""
    fast = json.dumps(place(prf, inventory, partitioner=indexed_partition, **kw).model_dump(mode="json"))
    ref = json.dumps(place(prf, inventory, **kw).model_dump(mode="json"))
    return fast, ref


@pytest.mark.parametrize("seed", range(6))
def test_indexed_place_equals_reference_on_random_pools(catalog, monkeypatch, seed):
    """Chosen devices, scores, terms, reasons, dropped sets, fits/available and suggestions are identical,
    for every algorithm, gang sizes 1-4, several needs, and new leases on the same (cached) snapshot; so
    are the options (every field) handed to the policy."""
    probed: list = []
    monkeypatch.setitem(registry._EXTRA, "options_probe", lambda: OptionsProbe(probed))
    rng = random.Random(seed)
    inventory = random_pool(catalog, rng)
    ids = [d.device_id for d in inventory.devices]
    assert inventory_index(inventory) is not None
    seen: set[str] = set()
    for trial in range(8):
        n = rng.choice([1, 1, 2, 3, 4])
        need = rng.choice([1, 4, 9, 14, 30, 70, 200]) * GIB + rng.randrange(GIB)
        leased = frozenset(rng.sample(ids, rng.randrange(0, 120)) + ["elsewhere:0"])
        policy = ResourcePolicySection(
            memory_threshold=rng.choice([0.85, 0.9, 1.0]),
            preferred_devices=rng.sample(["A100-SXM4-40GB", "T4", "V100-PCIE-32GB", "Ascend-910"], 2),
            tag_priorities=rng.choice([{}, {"domestic": 1.0}]),
            allowed_vendors=rng.choice([None, ["nvidia", "ascend"], ["nvidia", "amd", "kunlun"]]),
        )
        algorithms = ["rule_based", "fifo_first_fit", "random", "best_fit_memory", "gavel_max_throughput",
                      "options_probe"]
        if trial == 0:
            algorithms.append("rl_based")
        for algorithm in algorithms:
            fast, ref = both(prof(need, n), inventory, catalog=catalog, policy=policy,
                             algorithm=algorithm, leased=leased, seed=seed)
            assert fast == ref, (trial, algorithm)
            if algorithm == "options_probe" and probed:
                assert probed[-2] == probed[-1]
            fast = json.loads(fast)
            seen.update(r.split(":")[0].split(" of ")[0] for c in fast["candidates"] for r in c["reasons"])
            seen.update("more listed" for c in fast["candidates"] if any("not listed" in r for r in c["reasons"]))
    # the random pools reach every branch of the partition
    assert {"fits", "unhealthy", "leased by another run", "busy", "not enough free memory now", "never fits",
            "gang"} <= seen


def test_indexed_place_equals_reference_when_many_sets_are_free(catalog):
    """More than MAX_KEPT_CANDIDATES free sets per model: the least-loaded ones are kept, ties by pool order."""
    rng = random.Random(7)
    devices = [
        Device(device_id=f"h{h}:{i}", host=f"h{h}", index=i, model=model, declared=True,
               memory_total_bytes=catalog.get(model).memory_bytes, memory_used_bytes=rng.choice([0, GIB]),
               utilization_pct=rng.choice(UTILS[:5]))
        for h in range(120) for i, model in enumerate(["T4", "A100-SXM4-40GB", "T4", "V100-PCIE-32GB"])
    ]
    inventory = Inventory(source="test", declared=True, devices=devices)
    for n in (1, 2):
        for algorithm in ("rule_based", "random", "fifo_first_fit"):
            fast, ref = both(prof(4 * GIB, n), inventory, catalog=catalog,
                             policy=ResourcePolicySection(), algorithm=algorithm, leased=frozenset({"h3:1"}))
            assert fast == ref
            assert "more free device sets not listed" in fast


def test_pools_the_index_cannot_hold_use_the_reference_loop(catalog):
    """A NaN utilization (not indexed: the reference loop decides) or repeated device ids (indexed): the
    decision is the reference one."""
    rng = random.Random(3)
    pool = random_pool(catalog, rng, size=60)
    nan = Inventory(source="t", declared=True, devices=[
        d.model_copy(update={"utilization_pct": math.nan}) if i % 5 == 0 else d for i, d in enumerate(pool.devices)])
    assert inventory_index(nan) is None
    twice = Inventory(source="t", declared=True, devices=pool.devices + pool.devices[:10])
    assert inventory_index(twice) is not None
    for inventory in (nan, twice):
        for n in (1, 2):
            fast, ref = both(prof(3 * GIB, n), inventory, catalog=catalog,
                             policy=ResourcePolicySection(), leased=frozenset({pool.devices[0].device_id}))
            assert fast == ref


def test_index_is_built_once_per_inventory_and_dropped_with_it(catalog):
    """Repeated decisions on one snapshot reuse its index; another object (a copy) gets its own; the
    cache does not keep an inventory alive."""
    inventory = random_pool(catalog, random.Random(1), size=40)
    first = inventory_index(inventory)
    assert inventory_index(inventory) is first
    copy = inventory.model_copy()
    assert inventory_index(copy) is not first
    key = id(copy)
    del copy
    gc.collect()
    assert key not in module._CACHE
    inventory.devices.append(inventory.devices[0].model_copy(update={"device_id": "extra"}))
    assert len(inventory_index(inventory).devices) == 41       # a grown list is noticed and re-indexed


def _same_index(a, b) -> None:
    """Every field of two indexes is equal (arrays elementwise)."""
    import dataclasses

    import numpy as np

    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name
    assert a.vendor_codes[0] == b.vendor_codes[0] and np.array_equal(a.vendor_codes[1], b.vendor_codes[1])


@pytest.mark.parametrize("seed", range(4))
def test_incremental_index_equals_a_rebuilt_one(catalog, seed):
    """apply_changes patches the changed positions of the previous index; the result equals the index
    built from scratch on the new device list, and place() decides the same on it, round after round."""
    rng = random.Random(seed)
    cur = random_pool(catalog, rng, size=300)
    inventory_index(cur)
    for _ in range(6):
        picked = rng.sample(cur.devices, rng.randrange(1, 40))
        changed = [d.model_copy(update={
            "utilization_pct": rng.choice(UTILS), "memory_used_bytes": rng.randrange(0, d.memory_total_bytes + GIB),
            "healthy": rng.random() > 0.2, "index": rng.randrange(8),
            "vendor": rng.choice([d.vendor, "amd"]) if catalog.find(d.model) is None else d.vendor}) for d in picked]
        new = apply_changes(cur, changed)
        assert new is not cur and len(new.devices) == len(cur.devices)
        by_id = {d.device_id: d for d in changed}
        assert new.devices == [by_id.get(d.device_id, d) for d in cur.devices]
        assert module._CACHE[id(new)][1] is not None          # derived, not rebuilt
        _same_index(inventory_index(new), build_index(new))
        fresh = new.model_copy()                              # same devices, indexed from scratch
        n = rng.choice([1, 2, 4])
        policy = ResourcePolicySection(allowed_vendors=["nvidia", "amd", "ascend"])
        a = place(prof(rng.choice([2, 9, 30]) * GIB, n), new, catalog=catalog, policy=policy,
                  partitioner=indexed_partition)
        b = place(prof(a.needed_bytes, n), fresh, catalog=catalog, policy=policy, partitioner=indexed_partition)
        assert a.model_dump_json() == b.model_dump_json()
        cur = new


def test_changes_an_index_cannot_patch_rebuild_it(catalog):
    """A device that changes model, host or total memory, or a new device: the new snapshot is indexed from
    scratch (and a new device is appended)."""
    pool = random_pool(catalog, random.Random(9), size=50)
    inventory_index(pool)
    d0 = pool.devices[0]
    for change in ({"model": "T4", "memory_total_bytes": catalog.get("T4").memory_bytes}, {"host": "elsewhere"}):
        new = apply_changes(pool, [d0.model_copy(update=change)])
        _same_index(inventory_index(new), build_index(new))
    extra = d0.model_copy(update={"device_id": "brand-new"})
    new = apply_changes(pool, [extra])
    assert new.devices[-1] == extra and len(new.devices) == 51
