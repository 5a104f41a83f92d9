"""CPU, one process: ``set_device`` and ``paddle.distributed`` (ranks, spawn, DataParallel, fleet) as no-ops recorded."""

import paddle
import paddle.distributed as _dist

from .state import R

_orig_set_device = paddle.set_device


def _set_device(device=None, *a, **k):
    if device is not None and str(device) not in R["devices_asked"]:
        R["devices_asked"].append(str(device))
    return _orig_set_device("cpu")


def _noop(name, ret=None):
    def f(*a, **k):
        if name not in R["distributed_calls"]:
            R["distributed_calls"].append(name)
        return ret(*a, **k) if callable(ret) else ret
    return f



def _spawn(func, args=(), nprocs=-1, *a, **k):
    R["distributed_calls"].append(f"spawn(nprocs={nprocs})")
    func(*args)



def _data_parallel(layer, *a, **k):
    if "DataParallel" not in R["distributed_calls"]:
        R["distributed_calls"].append("DataParallel")
    object.__setattr__(layer, "_layers", layer)
    return layer


def install():
    """``set_device`` keeps the CPU; ``paddle.distributed``'s ranks, spawn, DataParallel and fleet act as one process."""
    setattr(paddle, "set_device", _set_device)
    if hasattr(paddle, "device"):
        setattr(paddle.device, "set_device", _set_device)
    _dist.init_parallel_env = _noop("init_parallel_env")
    _dist.get_rank = _noop("get_rank", 0)
    _dist.get_world_size = _noop("get_world_size", 1)
    _dist.spawn = _spawn
    setattr(paddle, "DataParallel", _data_parallel)
    try:
        from paddle.distributed import fleet as _fleet

        _fleet.init = _noop("fleet.init")
        _fleet.distributed_model = _noop("fleet.distributed_model", lambda m, *a, **k: m)
        _fleet.distributed_optimizer = _noop("fleet.distributed_optimizer", lambda o, *a, **k: o)
        _fleet.worker_num = _noop("fleet.worker_num", 1)
        _fleet.worker_index = _noop("fleet.worker_index", 0)
    except Exception:
        pass
