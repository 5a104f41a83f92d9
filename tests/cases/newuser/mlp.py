import argparse
import paddle
import paddle.nn as nn


class MLP(nn.Layer):
    def __init__(self, hidden=512):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    a = p.parse_args()
    model = MLP()
    opt = paddle.optimizer.Adam(parameters=model.parameters(), learning_rate=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(a.epochs):
        for step in range(5):
            x = paddle.randn([a.batch_size, 784])
            y = paddle.randint(0, 10, [a.batch_size, 1])
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
        print("epoch", epoch, float(loss))


if __name__ == "__main__":
    main()
