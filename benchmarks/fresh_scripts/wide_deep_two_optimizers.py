# Wide & Deep (Cheng et al. 2016) for app recommendation: the wide part is a linear model over 2.5M hashed cross
# features (a [2.5M, 1] embedding, summed), the deep part embeds 10 categorical fields into 32-d vectors and runs an
# MLP. As in the paper, the wide part is trained with FTRL-like sparse-friendly SGD and the deep part with Adagrad:
# two optimizers over disjoint parameter groups of one model. argparse with defaults.
import argparse

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--wide-buckets", type=int, default=2_500_000)
p.add_argument("--crosses-per-example", type=int, default=24)
p.add_argument("--field-vocab", type=int, nargs="+",
               default=[400_000, 250_000, 100_000, 60_000, 20_000, 5_000, 1_000, 300, 50, 12])
p.add_argument("--emb-dim", type=int, default=32)
p.add_argument("--hidden", type=int, nargs="+", default=[1024, 512, 256])
p.add_argument("--continuous", type=int, default=16)
p.add_argument("--batch-size", type=int, default=1024)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--seed", type=int, default=99)
FLAGS = p.parse_args()


class WideAndDeep(nn.Layer):
    def __init__(self, f):
        super().__init__()
        self.wide = nn.Embedding(f.wide_buckets, 1, sparse=True)
        self.wide_bias = self.create_parameter([1], is_bias=True)
        self.deep_emb = nn.LayerList([nn.Embedding(v, f.emb_dim) for v in f.field_vocab])
        dims = [len(f.field_vocab) * f.emb_dim + f.continuous] + f.hidden
        layers = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.BatchNorm1D(b), nn.ReLU()]
        self.deep = nn.Sequential(*layers, nn.Linear(dims[-1], 1))

    def forward(self, cross_ids, field_ids, continuous):
        wide_logit = self.wide(cross_ids).sum(axis=[1, 2]) + self.wide_bias
        deep_in = paddle.concat([e(field_ids[:, i]) for i, e in enumerate(self.deep_emb)] + [continuous], axis=-1)
        return wide_logit + self.deep(deep_in).squeeze(-1)


def batch(rng, f):
    cross = rng.integers(0, f.wide_buckets, (f.batch_size, f.crosses_per_example)).astype("int64")
    fields = np.stack([rng.integers(0, v, f.batch_size) for v in f.field_vocab], 1).astype("int64")
    cont = rng.standard_normal((f.batch_size, f.continuous)).astype("float32")
    label = (rng.random(f.batch_size) < 0.2).astype("float32")
    return [paddle.to_tensor(a) for a in (cross, fields, cont, label)]


def main():
    paddle.seed(FLAGS.seed)
    rng = np.random.default_rng(FLAGS.seed)
    model = WideAndDeep(FLAGS)
    wide_params = [model.wide.weight, model.wide_bias]
    deep_params = [q for q in model.parameters() if all(q is not w for w in wide_params)]
    wide_opt = paddle.optimizer.SGD(0.05, parameters=wide_params, weight_decay=paddle.regularizer.L1Decay(1e-6))
    deep_opt = paddle.optimizer.Adagrad(0.01, parameters=deep_params, initial_accumulator_value=0.1)
    for step in range(FLAGS.steps):
        cross, fields, cont, label = batch(rng, FLAGS)
        loss = F.binary_cross_entropy_with_logits(model(cross, fields, cont), label)
        loss.backward()
        wide_opt.step()
        deep_opt.step()
        wide_opt.clear_grad()
        deep_opt.clear_grad()
        print(f"step {step} loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
