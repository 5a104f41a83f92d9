# Micro-batches of 128 rows sliced out of a 4096-row feature tensor the script creates itself, two epochs
# (fresh-script kind: spec-batch-not-used said "the script uses batch 4096", the data set's rows, not its batch)
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

ROWS, MICRO, EPOCHS = 4096, 128, 2


def main():
    paddle.seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = paddle.optimizer.Adam(1e-3, parameters=model.parameters())
    features = paddle.randn([ROWS, 32])
    labels = paddle.randint(0, 10, [ROWS, 1])
    for _ in range(EPOCHS):
        for start in range(0, ROWS, MICRO):
            loss = F.cross_entropy(model(features[start:start + MICRO]), labels[start:start + MICRO])
            loss.backward()
            opt.step()
            opt.clear_grad()


if __name__ == "__main__":
    main()
