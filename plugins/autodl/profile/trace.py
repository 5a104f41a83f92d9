"""Symbolic tensors, the op trace of one forward pass, and the simulation of its training-step peak memory.

Details: docs/reference/estimator.md#autodlprofiletrace.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

DTYPE_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1,
}
"""Element sizes in bytes (IEEE 754 / C integer widths)."""

_ids = itertools.count(1)


@dataclass(eq=False)
class Tensor:
    """A symbolic tensor: a shape (ints, batch first when batched) and a dtype; no data."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    requires_grad: bool = True
    view_of: "Tensor | None" = None
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        """Bytes of its own storage (0 for a view that shares another tensor's storage)."""
        if self.view_of is not None:
            return 0
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:  # used in messages
        return f"[{', '.join(str(d) for d in self.shape)}]"


@dataclass
class Op:
    """One forward op: what it read, what it wrote, what it keeps for backward, what it costs."""

    kind: str
    inputs: list[Tensor]
    outputs: list[Tensor]
    saved: list[Tensor] = field(default_factory=list)
    extra_saved_bytes: int = 0
    grad_scratch_bytes: int = 0
    param_bytes: int = 0
    inplace_grad: bool = False
    grad_into_saved: bool = False
    flops: float = 0.0
    layer: str | None = None


class Trace:
    """The ops of one forward pass, in order."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.inputs: list[Tensor] = []

    def input(self, shape, dtype: str = "float32") -> Tensor:
        t = Tensor(tuple(int(d) for d in shape), dtype, requires_grad=False)
        self.inputs.append(t)
        return t

    def op(
        self,
        kind: str,
        inputs: list[Tensor],
        out_shapes: list[tuple[int, ...]] | tuple[int, ...],
        *,
        saves: str = "",
        dtype: str | None = None,
        view: bool = False,
        extra_saved_bytes: int = 0,
        grad_scratch_bytes: int = 0,
        param_bytes: int = 0,
        inplace_grad: bool = False,
        grad_into_saved: bool = False,
        flops: float = 0.0,
        layer: str | None = None,
        differentiable: bool = True,
    ) -> Tensor | list[Tensor]:
        """Record an op and return its output tensor(s).

        :param saves: which tensors backward keeps: any of ``'x'`` (first input), ``'i'`` (all
            inputs), ``'o'`` (outputs).
        :param view: the output shares its input's storage (reshape, transpose, slice under Paddle's
            stride kernels).
        :param param_bytes: bytes of this op's trainable parameters; backward allocates their
            gradient before accumulating it into ``.grad``.
        :param grad_into_saved: backward writes the input gradient into the buffer it saved
            (``cross_entropy_with_softmax_grad``: ``inplace: (softmax -> logits_grad)``).
        """
        single = bool(out_shapes) and isinstance(out_shapes[0], int) or out_shapes == ()
        shapes = [tuple(out_shapes)] if single else [tuple(s) for s in out_shapes]
        rg = differentiable and (param_bytes > 0 or any(t.requires_grad for t in inputs))
        dt = dtype or (inputs[0].dtype if inputs and inputs[0].dtype.startswith(("float", "bfloat")) else "float32")
        outs = [Tensor(tuple(int(d) for d in s), dt, rg, view_of=(inputs[0] if view and inputs else None)) for s in shapes]
        saved: list[Tensor] = []
        if "x" in saves and inputs:
            saved.append(inputs[0])
        if "i" in saves:
            saved.extend(inputs)
        if "o" in saves:
            saved.extend(outs)
        self.ops.append(
            Op(kind, list(inputs), outs, saved, extra_saved_bytes, grad_scratch_bytes, param_bytes,
               inplace_grad, grad_into_saved, flops, layer)
        )
        return outs[0] if single else outs

    @property
    def forward_flops(self) -> float:
        return float(sum(o.flops for o in self.ops))


def _storage(t: Tensor) -> Tensor:
    while t.view_of is not None:
        t = t.view_of
    return t


def simulate_peak(trace: Trace, held: list[Tensor] | None = None) -> int:
    """Peak bytes of activations and activation gradients during one training step.

    Excludes parameters, their persistent ``.grad`` buffers and optimizer state (model states),
    includes the model inputs, every tensor kept for backward, and backward's transient buffers.

    :param trace: the forward trace.
    :param held: tensors the caller keeps referenced (the logits ``out`` of ``loss = f(out, y)``);
        the loss is the last op's first output and seeds backward.
    :returns: bytes.
    """
    ops = trace.ops
    if not ops:
        return sum(t.nbytes for t in trace.inputs)
    output = ops[-1].outputs[0]
    # reference counts of storages kept for backward
    keep: dict[int, int] = {}
    size: dict[int, int] = {}

    def hold(t: Tensor) -> None:
        s = _storage(t)
        size[s.id] = s.nbytes
        keep[s.id] = keep.get(s.id, 0) + 1

    for t in trace.inputs:
        hold(t)
    hold(output)
    for t in held or []:
        hold(t)
    peak = 0
    extras = 0
    for op in ops:
        for t in op.saved:
            hold(t)
        extras += op.extra_saved_bytes
        # forward: retained tensors so far + this op's transient inputs and outputs
        cur = sum(size[i] for i in keep) + extras
        cur += sum(t.nbytes for t in op.outputs if _storage(t).id not in keep)
        cur += sum(_storage(t).nbytes for t in op.inputs if _storage(t).id not in keep)
        peak = max(peak, cur)
    retained = sum(size[i] for i in keep) + extras
    grads: dict[int, int] = {output.id: output.numel * 4}
    grad_total = output.numel * 4
    peak = max(peak, retained + grad_total)
    for op in reversed(ops):
        flowing = [t for t in op.outputs if t.id in grads]
        if flowing:
            need = [t for t in op.inputs if t.requires_grad]
            new = sum(t.numel * 4 for t in need)
            freed = sum(grads[t.id] for t in flowing)
            if op.inplace_grad:
                new = max(0, new - freed)
            if op.grad_into_saved:
                new = max(0, new - op.extra_saved_bytes)
            peak = max(peak, retained + grad_total + new + op.grad_scratch_bytes + op.param_bytes)
            for t in flowing:
                grad_total -= grads.pop(t.id)
            for t in need:
                b = t.numel * 4
                if t.id in grads:  # accumulation: the sum is a new buffer, both addends freed
                    peak = max(peak, retained + grad_total + b)
                else:
                    grads[t.id] = b
                    grad_total += b
        for t in op.saved:
            s = _storage(t)
            keep[s.id] -= 1
            if keep[s.id] == 0:
                retained -= size[s.id]
                del keep[s.id]
        retained -= op.extra_saved_bytes
    return int(peak)
