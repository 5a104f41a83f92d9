"""The truth for ``transformer_varlen.py`` at the spec's sequence length: the same model, loss and optimizer, every
sequence 512 tokens long. Prints Paddle's CPU allocator peak after the epoch's steps (MiB), as the README here says:
``AUTODL_BATCH_SIZE_PER_GPU=16 python transformer_len512_truth.py`` (1257.1 MiB; 2431.5 MiB at 32)."""
import os
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.io import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_varlen import Model, VarLen, collate  # noqa: E402


class Len512(VarLen):
    def __init__(self, n=64):
        super().__init__(n)
        self.lens = np.full(n, 512)


if __name__ == "__main__":
    paddle.set_device("cpu")
    bs = int(os.environ.get("AUTODL_BATCH_SIZE_PER_GPU", "16"))
    m = Model()
    opt = paddle.optimizer.Adam(learning_rate=1e-4, parameters=m.parameters())
    for step, (ids, y) in enumerate(DataLoader(Len512(64), batch_size=bs, collate_fn=collate, shuffle=True)):
        loss = F.cross_entropy(m(ids), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
    from paddle.base import core

    print(f"peak {core.host_memory_stat_peak_value('Allocated', 0) / 2**20:.1f} MiB at batch {bs}")
