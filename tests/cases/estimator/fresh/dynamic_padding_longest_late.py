"""Per-batch padding in a collate_fn: sequences are short except a few late in the epoch; the longest batch sets the
peak (issue 18 item 3, t5_seq2seq_dynpad's kind)."""
import numpy as np
import paddle
from paddle.io import DataLoader, Dataset

LENGTHS = [12 + (i * 7) % 20 for i in range(96)] + [384, 12, 20, 16] * 2 + [30] * 24


class Tokens(Dataset):
    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        return list(range(1, LENGTHS[i] + 1))


def pad(batch):
    n = max(len(s) for s in batch)
    ids = np.zeros((len(batch), n), "int64")
    for k, s in enumerate(batch):
        ids[k, :len(s)] = np.array(s) % 1000
    return ids


class Tagger(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.emb = paddle.nn.Embedding(1000, 128)
        self.mix = paddle.nn.Linear(128, 512)
        self.out = paddle.nn.Linear(512, 1000)

    def forward(self, ids):
        return self.out(paddle.nn.functional.gelu(self.mix(self.emb(ids))))


model = Tagger()
opt = paddle.optimizer.AdamW(parameters=model.parameters())
for ids in DataLoader(Tokens(), batch_size=8, shuffle=False, collate_fn=pad):
    logits = model(ids)
    loss = paddle.nn.functional.cross_entropy(logits.reshape([-1, 1000]), ids.reshape([-1]))
    loss.backward()
    opt.step()
    opt.clear_grad()
