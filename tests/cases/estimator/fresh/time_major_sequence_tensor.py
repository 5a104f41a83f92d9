# A time-major LSTM fed a [steps, batch, features] tensor the script creates (no DataLoader): the first
# dimension is the sequence (50), the batch is 16; nothing may read 50 as the batch the script trains at
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

SEQ, BATCH, FEAT = 50, 16, 8


class Tagger(nn.Layer):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(FEAT, 64, time_major=True)
        self.out = nn.Linear(64, 5)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h)


def main():
    paddle.seed(0)
    model = Tagger()
    opt = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    for _ in range(6):
        x = paddle.randn([SEQ, BATCH, FEAT])
        y = paddle.randint(0, 5, [SEQ, BATCH, 1])
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
