"""Character language model unrolled by hand: an LSTMCell called in a Python loop over time-major input."""
import argparse

import paddle
import paddle.nn as nn
import paddle.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    return p.parse_args()


class CharLM(nn.Layer):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.emb = nn.Embedding(vocab, 64)
        self.cell = nn.LSTMCell(64, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids):  # ids: [time, batch]
        x = self.emb(ids)
        state = None
        outs = []
        for t in range(x.shape[0]):
            h, state = self.cell(x[t], state)
            outs.append(h)
        return self.out(paddle.stack(outs))


if __name__ == "__main__":
    a = parse()
    model = CharLM(a.vocab, a.hidden)
    opt = paddle.optimizer.RMSProp(learning_rate=1e-3, parameters=model.parameters())
    for it in range(3):
        seq = paddle.randint(0, a.vocab, [a.steps + 1, a.batch])
        logits = model(seq[:-1])
        loss = F.cross_entropy(logits.reshape([-1, a.vocab]), seq[1:].reshape([-1, 1]))
        loss.backward()
        opt.step()
        opt.clear_grad()
