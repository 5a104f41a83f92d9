"""A bidirectional LSTM sequence tagger (benchmark model)."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

BATCH_SIZE = 32
SEQ_LEN = 64
VOCAB = 20000
EMBED = 128
HIDDEN = 256
NUM_TAGS = 17


class Tagger(nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.lstm = nn.LSTM(EMBED, HIDDEN, num_layers=2, direction="bidirect")
        self.out = nn.Linear(2 * HIDDEN, NUM_TAGS)

    def forward(self, ids):
        x = self.embed(ids)
        x, _ = self.lstm(x)
        return self.out(x)


def main():
    model = Tagger()
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    for _ in range(3):
        ids = paddle.randint(0, VOCAB, [BATCH_SIZE, SEQ_LEN])
        tags = paddle.randint(0, NUM_TAGS, [BATCH_SIZE, SEQ_LEN, 1])
        loss = F.cross_entropy(model(ids), tags)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
