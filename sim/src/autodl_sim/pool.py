"""Simulated pools: device-model groups of identical hosts, read from ``autodl_sim/data/sim-*.yaml`` or a declared pool file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autodl.catalog import Catalog
from autodl.config import include_dir, read_yaml
from autodl.errors import AutoDLError

DEFAULT_SIM_POOL = "sim-pai-hetero.yaml"


@dataclass(frozen=True, slots=True)
class HostGroup:
    """``hosts`` identical hosts of ``gpus_per_host`` devices of one catalog model."""

    model: str
    vendor: str
    hosts: int
    gpus_per_host: int
    memory_bytes: int
    cost_per_hour_usd: float | None
    tags: tuple[str, ...]

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host


@dataclass(frozen=True, slots=True)
class SimPool:
    """A simulated pool in file order (first-fit order)."""

    source: str
    groups: tuple[HostGroup, ...]

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)


def load_sim_pool(path: str | Path | None, catalog: Catalog) -> SimPool:
    """Read a simulated pool.

    Two layouts: ``groups: [{model, hosts, gpus_per_host}]`` (a ``sim-*.yaml`` file), or a declared
    pool (``host:`` + ``devices: [{model, ...}]``, like ``demo.yaml``), read as one host per group.

    :param path: the YAML file; a bare name is looked up in ``autodl_sim/data/``, then in autodl's ``include/pools/``; default
        :data:`DEFAULT_SIM_POOL`.
    :param catalog: resolves model names, memory, vendor, price and tags.
    :raises AutoDLError: on a missing file or an entry without a known model (naming file and entry).
    """
    p = Path(path or DEFAULT_SIM_POOL)
    if not os.path.isfile(p) and not p.is_absolute():
        own = Path(__file__).resolve().parent / "data" / p
        p = own if own.is_file() else include_dir() / "pools" / p
    if not os.path.isfile(p):
        raise AutoDLError(f"{p}: pool file not found; pass --pool with a pool file (autodl_sim/data/sim-*.yaml or autodl's include/pools/).")
    raw = read_yaml(p, AutoDLError, "pool file not found; pass --pool with a pool file (autodl_sim/data/sim-*.yaml or autodl's include/pools/).") or {}
    if not isinstance(raw, dict):
        raise AutoDLError(f"{p}: a simulated pool is a mapping with 'groups:' or 'devices:'; see autodl_sim/data/{DEFAULT_SIM_POOL}.")
    groups: list[HostGroup] = []
    if "groups" in raw:
        for i, g in enumerate(raw["groups"] or []):
            try:
                gpu = catalog.get(g["model"])
                hosts, per = int(g.get("hosts", 1)), int(g.get("gpus_per_host", 8))
            except (KeyError, TypeError, ValueError) as exc:
                raise AutoDLError(f"{p}: groups[{i}]: {exc}; each group needs model, hosts, gpus_per_host.") from None
            except AutoDLError as exc:
                raise AutoDLError(f"{p}: groups[{i}]: {exc}") from None
            if hosts < 1 or per < 1:
                raise AutoDLError(f"{p}: groups[{i}]: hosts and gpus_per_host must be >= 1.")
            groups.append(HostGroup(gpu.name, gpu.vendor, hosts, per, gpu.memory_bytes, gpu.cost_per_hour_usd, tuple(gpu.tags)))
    elif "devices" in raw:
        counts: dict[str, int] = {}
        for i, d in enumerate(raw["devices"] or []):
            try:
                name = catalog.get(d["model"]).name
            except (KeyError, TypeError):
                raise AutoDLError(f"{p}: devices[{i}]: missing 'model'.") from None
            counts[name] = counts.get(name, 0) + 1
        for name, c in counts.items():
            gpu = catalog.get(name)
            groups.append(HostGroup(gpu.name, gpu.vendor, 1, c, gpu.memory_bytes, gpu.cost_per_hour_usd, tuple(gpu.tags)))
    if not groups:
        raise AutoDLError(f"{p}: no 'groups:' or 'devices:'; see autodl_sim/data/{DEFAULT_SIM_POOL} for the layout.")
    return SimPool(str(p), tuple(groups))


def scale_pool(pool: SimPool, factor: float) -> SimPool:
    """``pool`` with each group's host count multiplied by ``factor`` and rounded (at least one host).

    :raises AutoDLError: when ``factor`` is not > 0.
    """
    if not factor > 0:
        raise AutoDLError(f"pool scale {factor}: must be > 0 (0.5 = the pool halved).")
    import dataclasses

    groups = tuple(dataclasses.replace(g, hosts=max(1, round(g.hosts * factor))) for g in pool.groups)
    return SimPool(f"{pool.source} x{factor:g}", groups)
