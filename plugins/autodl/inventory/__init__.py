"""The device inventory: what accelerators the pool has and how loaded they are, from NVML or a declared pool file.

Sources are a registry chosen by name (``AUTODL_POOL`` or the ``--pool`` option):

* ``nvml`` — the local NVIDIA driver through ``nvidia-ml-py`` (module ``pynvml``);
* a path to a pool YAML file — devices declared by hand (``include/pools/demo.yaml``);
* ``auto`` (default) — NVML when a driver answers, else the demo pool file, marked as declared.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autodl.catalog import Catalog, load_catalog
from autodl.config import default_pool_file, pool_source
from autodl.errors import InventoryError
from autodl.inventory.declared import read_pool_file
from autodl.inventory.nvml import NvmlUnavailable, read_nvml
from autodl.types import Inventory

SOURCES: dict[str, Callable[[Catalog], Inventory]] = {
    "nvml": read_nvml,
}


def read_inventory(source: str | Path | None = None, *, catalog: Catalog | None = None) -> Inventory:
    """Snapshot of the pool.

    :param source: ``'auto'`` (default, or ``$AUTODL_POOL`` / ``[autodl] pool``), a registered source name such as
        ``'nvml'``, or the path of a pool YAML file.
    :param catalog: GPU catalog used to name device models; default :func:`load_catalog`.
    :returns: an :class:`~autodl.types.Inventory`; ``declared=True`` when the devices came from a file.
    :raises InventoryError: for a bad pool file, or ``'nvml'`` asked for explicitly with no driver.
    """
    catalog = catalog or load_catalog()
    source = str(source or pool_source())
    if source == "auto":
        try:
            inventory = read_nvml(catalog)
        except NvmlUnavailable:
            return read_pool_file(default_pool_file(), catalog)
        if inventory.devices:
            return inventory
        return read_pool_file(default_pool_file(), catalog)
    if source in SOURCES:
        try:
            return SOURCES[source](catalog)
        except NvmlUnavailable as exc:
            raise InventoryError(
                f"pool source {source!r}: {exc}; install the NVIDIA driver or use a pool file (--pool include/pools/demo.yaml)."
            ) from None
    return read_pool_file(Path(source), catalog)


__all__ = ["SOURCES", "read_inventory", "read_pool_file", "read_nvml"]
