# Micro-batches of 2 sliced out of one token tensor of 64 rows the script creates itself
# (fresh-script kind: the dry run shrank the 64 rows to 1, the second slice was empty, the report was refused)
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

VOCAB, SEQ, MICRO, STEPS = 8000, 64, 2, 4


class LM(nn.Layer):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 256)
        self.mix = nn.Linear(256, 256)
        self.head = nn.Linear(256, VOCAB)

    def forward(self, idx):
        return self.head(F.gelu(self.mix(self.emb(idx))))


def main():
    paddle.seed(0)
    model = LM()
    opt = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    data = paddle.randint(0, VOCAB, [64, SEQ + 1], dtype="int64")
    for step in range(STEPS):
        chunk = data[step * MICRO:(step + 1) * MICRO]
        x, y = chunk[:, :-1], chunk[:, 1:]
        loss = F.cross_entropy(model(x).reshape([-1, VOCAB]), y.reshape([-1]))
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
