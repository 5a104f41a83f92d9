"""The FLOPs counter: ``_flops.py`` next to this package (shared with the probe child), loaded by its path."""

import importlib.util
import os
from types import ModuleType

import paddle


def _load_flops() -> ModuleType:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_flops.py")
    spec = importlib.util.spec_from_file_location("_autodl_flops", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"autodl's FLOPs counter is missing: {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FL = _load_flops()
"""The counter: ``FL.state`` (``on``, ``flops``), ``FL.attach(layer)``, ``FL.install(paddle)``."""


def install():
    """Count ``paddle.matmul``, ``bmm``, ``Tensor.matmul`` and ``@`` (layers are counted when first called)."""
    FL.install(paddle)
