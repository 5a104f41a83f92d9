"""PyTorch's CUDA out-of-memory messages are explained like Paddle's (issue 22: the GPU check's framework-neutral
training runs on PyTorch, and its provoked out-of-memory went unrecognised). Texts as PyTorch's caching
allocator prints them (``c10/cuda/CUDACachingAllocator.cpp``), before and since 2.2."""

from __future__ import annotations

import pytest

from autodl.oom import explain, find_oom

MiB, GiB = 1 << 20, 1 << 30

OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB "
       "already allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch) If reserved memory is >> allocated")
NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 175.00 GiB. GPU 0 has a total capacity of "
       "139.81 GiB of which 139.20 GiB is free. Including non-PyTorch memory, this process has 614.00 MiB memory in use.")


@pytest.mark.parametrize("text, requested, free, total", [
    (OLD, 36 * MiB, round(47.06 * MiB), round(7.93 * GiB)),
    (NEW, 175 * GiB, round(139.20 * GiB), round(139.81 * GiB)),
])
def test_pytorch_messages_give_the_request_the_free_and_the_total(text, requested, free, total):
    kind, fields = find_oom([text])
    assert kind == "device" and fields["device"] == "GPU 0"
    assert (fields["req"], fields["free"], fields["total"]) == (requested, free, total)


def test_a_request_larger_than_the_card_is_too_big_not_busy():
    report = explain([NEW])
    assert report is not None and report.verdict == "too_big"
    assert report.requested_bytes == 175 * GiB
