# The step's batch comes from a helper (rows // 32 = 128 of a 4096-row tensor the script creates)
# (fresh-script kind: the static reading cannot follow the helper, and the spec's batch was not checked at all)
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


def step_size(rows):
    return rows // 32


def batches(x, y):
    n = step_size(x.shape[0])
    for i in range(0, x.shape[0], n):
        yield x[i:i + n], y[i:i + n]


def main():
    paddle.seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = paddle.optimizer.Adam(1e-3, parameters=model.parameters())
    x = paddle.randn([4096, 32])
    y = paddle.randint(0, 10, [4096, 1])
    for _ in range(2):
        for xb, yb in batches(x, y):
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.clear_grad()


if __name__ == "__main__":
    main()
