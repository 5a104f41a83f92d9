"""A bucketing batch sampler with a token budget: short sequences come many to a batch, long ones few; the batch
with the most padded tokens is in the middle of the epoch (issue 18 item 3, asr_ctc_bucket_sampler's kind)."""
import numpy as np
import paddle
from paddle.io import BatchSampler, DataLoader, Dataset

LENGTHS = [16] * 64 + [40] * 24 + [96] * 10 + [24] * 40 + [200] * 4
FEAT = 64


class Frames(Dataset):
    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return rng.standard_normal((LENGTHS[i], FEAT)).astype("float32"), np.int64(i % 5)


class TokenBudget(BatchSampler):
    """Batches of one length each, as many samples as fit in 960 frames."""

    def __init__(self, budget=960):
        self.batches = []
        order = sorted(range(len(LENGTHS)), key=lambda i: (LENGTHS[i], i))
        cur = []
        for i in order:
            if cur and (len(cur) + 1) * LENGTHS[i] > budget or cur and LENGTHS[cur[0]] != LENGTHS[i]:
                self.batches.append(cur)
                cur = []
            cur.append(i)
        self.batches.append(cur)
        self.batches = self.batches[::3] + self.batches[1::3] + self.batches[2::3]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def collate(items):
    n = max(x.shape[0] for x, _ in items)
    out = np.zeros((len(items), n, FEAT), "float32")
    for k, (x, _) in enumerate(items):
        out[k, :x.shape[0]] = x
    return out, np.array([y for _, y in items])


model = paddle.nn.Sequential(paddle.nn.Linear(FEAT, 256), paddle.nn.ReLU(), paddle.nn.Linear(256, 256),
                             paddle.nn.ReLU(), paddle.nn.Linear(256, 5))
opt = paddle.optimizer.Adam(parameters=model.parameters())
loader = DataLoader(Frames(), batch_sampler=TokenBudget(), collate_fn=collate)
for epoch in range(1):
    for x, y in loader:
        loss = paddle.nn.functional.cross_entropy(model(x).mean(axis=1), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
