"""What every launcher does for a packed run (two runs on one device, ``docs/reference/fractional-leases.md``).

Apart from :mod:`autodl.launch.base` so that the packing rule (:mod:`autodl.policy.packing`) is imported by the
launchers only, never by the modules the launch request's own types come from (``scripts/import_graph.py``).
"""

from __future__ import annotations

from autodl.launch.base import LaunchRequest
from autodl.policy.packing import CAP_NOT_VERIFIED, memory_cap_env
from autodl.profile.memory import MIB


def _cap_value(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def memory_cap(request: LaunchRequest, user_env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Paddle's flags that cap a packed run at ``request.device_memory_cap_bytes``, and the lines to log.

    The flags are :func:`autodl.policy.packing.memory_cap_env` of the cap and the booked device's memory. A value
    the user set for either flag (``launcher.env`` or ``request.env``, given as ``user_env``) never raises the
    cap: the lower of the two wins, and the log says which; a value that is not a number is replaced.
    No cap (None), a CPU run or no device: no flags, nothing to say.

    :returns: ``(variables to set after the user's, lines for the log)``; the last line says
        :data:`~autodl.policy.packing.CAP_NOT_VERIFIED`.
    """
    cap = request.device_memory_cap_bytes
    if not cap or request.on_cpu or not request.devices:
        return {}, []
    total = request.devices[0].memory_total_bytes
    env = memory_cap_env(cap, total)
    lines = []
    for name, ours in list(env.items()):
        theirs = user_env.get(name)
        if theirs is None:
            continue
        value = _cap_value(theirs)
        if value is not None and 0 < value < float(ours):
            env[name] = theirs
            lines.append(f"run {request.run_key}: {name}={theirs} from launcher.env is below the packing cap's "
                         f"{ours}: kept (the lower wins)")
        else:
            lines.append(f"run {request.run_key}: {name}={theirs} from launcher.env would not keep the run within "
                         f"its share of the device: set to the packing cap's {ours} (the lower wins)")
    lines.append(f"run {request.run_key}: device memory capped at {cap // MIB} MiB of {total // MIB} MiB (a packed "
                 f"run's share): FLAGS_fraction_of_gpu_memory_to_use={env['FLAGS_fraction_of_gpu_memory_to_use']}, "
                 f"FLAGS_gpu_memory_limit_mb={env['FLAGS_gpu_memory_limit_mb']}; {CAP_NOT_VERIFIED}")
    return env, lines
