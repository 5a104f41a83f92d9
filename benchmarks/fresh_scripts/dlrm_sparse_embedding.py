# DLRM-style click-through model (Naumov et al. 2019): a bottom MLP for dense features, one embedding table per
# categorical field (the largest, hashed user ids, 4M rows with sparse=True gradients), pairwise dot-product feature
# interaction, a top MLP. Adam in lazy mode updates only the looked-up rows. Config in a typing.NamedTuple.
from typing import NamedTuple, Tuple

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


class Config(NamedTuple):
    table_rows: Tuple[int, ...] = (4_000_000, 200_000, 50_000, 10_000, 1_000, 1_000, 100, 24)
    sparse_tables: Tuple[int, ...] = (0,)        # which tables get sparse (SelectedRows) gradients
    emb_dim: int = 16
    num_dense: int = 13
    bottom_mlp: Tuple[int, ...] = (512, 256, 16)
    top_mlp: Tuple[int, ...] = (512, 256, 1)
    batch_size: int = 2048
    steps: int = 12
    lr: float = 1e-3
    seed: int = 2024


C = Config()


def mlp(dims, last_act):
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2 or last_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.embs = nn.LayerList([nn.Embedding(n, c.emb_dim, sparse=(i in c.sparse_tables))
                                  for i, n in enumerate(c.table_rows)])
        self.bottom = mlp((c.num_dense,) + c.bottom_mlp, last_act=True)
        f = len(c.table_rows) + 1
        self.top = mlp((c.emb_dim + f * (f - 1) // 2,) + c.top_mlp, last_act=False)
        self.f = f

    def forward(self, dense, sparse_ids):
        x = self.bottom(dense)                                                  # [B, D]
        feats = paddle.stack([x] + [e(sparse_ids[:, i]) for i, e in enumerate(self.embs)], axis=1)  # [B, F, D]
        inter = paddle.bmm(feats, feats.transpose([0, 2, 1]))                  # [B, F, F]
        iu = np.triu_indices(self.f, 1)
        flat = inter.reshape([inter.shape[0], -1])
        pairs = paddle.index_select(flat, paddle.to_tensor(iu[0] * self.f + iu[1]), axis=1)
        return self.top(paddle.concat([x, pairs], axis=1)).squeeze(-1)


def synthetic_batch(rng, c):
    dense = np.log1p(rng.exponential(3.0, (c.batch_size, c.num_dense))).astype("float32")
    # power-law ids, as in real logs: most rows are never touched in a step
    ids = np.stack([np.minimum(rng.zipf(1.2, c.batch_size) - 1, n - 1) for n in c.table_rows], 1).astype("int64")
    clicks = (rng.random(c.batch_size) < 0.03).astype("float32")
    return paddle.to_tensor(dense), paddle.to_tensor(ids), paddle.to_tensor(clicks)


if __name__ == "__main__":
    paddle.seed(C.seed)
    rng = np.random.default_rng(C.seed)
    model = DLRM(C)
    opt = paddle.optimizer.Adam(C.lr, parameters=model.parameters(), lazy_mode=True)
    for step in range(C.steps):
        dense, ids, clicks = synthetic_batch(rng, C)
        logit = model(dense, ids)
        loss = F.binary_cross_entropy_with_logits(logit, clicks)
        loss.backward()
        opt.step()
        opt.clear_grad()
        print(f"step {step} logloss {float(loss):.4f}")
