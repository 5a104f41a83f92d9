"""The device inventory: what accelerators the pool has and how loaded they are, from NVML, Prometheus/DCGM or a pool file.

Details: docs/reference/hardware.md#autodlinventory.
"""

from __future__ import annotations

from pathlib import Path

from autodl.catalog import Catalog, load_catalog
from autodl.config import default_pool_file, pool_source
from autodl.errors import InventoryError
from autodl.inventory.declared import read_pool_file
from autodl.inventory.nvml import NvmlFailed, NvmlUnavailable, read_nvml
from autodl.registry import INVENTORY_SCHEMES, INVENTORY_SOURCES, load
from autodl.types import Inventory

_BROKEN_NVML_FIX = (
    "the NVIDIA driver is installed but NVML fails; fix the driver (after a driver upgrade: reboot, or reload "
    "the kernel module; check `nvidia-smi`), or set AUTODL_POOL / --pool to a pool file to use declared devices on purpose."
)

_NVML_FIXES: dict[int, str] = {
    4: ("this user may not open the NVIDIA devices; check the permissions of /dev/nvidiactl and /dev/nvidia* "
        "(the `video` group, or the container's device list) and run `nvidia-smi` as the same user, or set "
        "AUTODL_POOL / --pool to a pool file to use declared devices on purpose."),
}
"""What to do for a broken NVML, by NVML return code (``nvml.h``: 4 = ``NVML_ERROR_NO_PERMISSION``); other codes
get :data:`_BROKEN_NVML_FIX`."""


def _broken_fix(exc: NvmlFailed) -> str:
    code = getattr(exc, "code", None)
    return _NVML_FIXES.get(code, _BROKEN_NVML_FIX) if isinstance(code, int) else _BROKEN_NVML_FIX


def read_inventory(source: str | Path | None = None, *, catalog: Catalog | None = None) -> Inventory:
    """Snapshot of the pool.

    :param source: ``'auto'`` (default, or ``$AUTODL_POOL`` / ``[autodl] pool``), a registered source name such as
        ``'nvml'`` (:data:`autodl.registry.INVENTORY_SOURCES`), a URL of a registered scheme
        (``prometheus+http://127.0.0.1:9090``, :data:`autodl.registry.INVENTORY_SCHEMES`), or the path of a pool
        YAML file.
    :param catalog: GPU catalog used to name device models; default :func:`load_catalog`.
    :returns: an :class:`~autodl.types.Inventory`; ``declared=True`` when the devices came from a file;
        ``notes`` say why ``auto`` chose what it chose.
    :raises InventoryError: for a bad pool file, an unreachable Prometheus, ``'nvml'`` asked for with
        no driver, or NVML present but failing (exit code 5).
    """
    catalog = catalog or load_catalog()
    source = str(source or pool_source())
    if source == "auto":
        try:
            return read_nvml(catalog)
        except NvmlUnavailable as exc:
            fallback = read_pool_file(default_pool_file(), catalog)
            return fallback.model_copy(update={"notes": [
                *fallback.notes, f"no NVIDIA GPU here ({exc}): using the declared pool {default_pool_file()}"]})
        except NvmlFailed as exc:
            raise InventoryError(f"pool source 'auto': {exc}; {_broken_fix(exc)}") from None
    scheme = source.split("://", 1)[0] if "://" in source else None
    if scheme in INVENTORY_SCHEMES:
        by_url: Inventory = load(INVENTORY_SCHEMES[scheme])(source, catalog)
        return by_url
    if source in INVENTORY_SOURCES:
        try:
            by_name: Inventory = load(INVENTORY_SOURCES[source])(catalog)
            return by_name
        except NvmlUnavailable as exc:
            raise InventoryError(
                f"pool source {source!r}: {exc}; install the NVIDIA driver or use a pool file (--pool include/pools/demo.yaml)."
            ) from None
        except NvmlFailed as exc:
            raise InventoryError(f"pool source {source!r}: {exc}; {_broken_fix(exc)}") from None
    if scheme is not None:
        raise InventoryError(f"pool source {source!r}: unknown scheme {scheme!r}; use one of: "
                             f"{', '.join(sorted(INVENTORY_SCHEMES))}, a source name ({', '.join(INVENTORY_SOURCES)}), auto, or a "
                             "pool file.")
    return read_pool_file(Path(source), catalog)


__all__ = ["read_inventory", "read_pool_file", "read_nvml"]
