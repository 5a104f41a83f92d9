"""LeNet-5 on MNIST-sized inputs, written out layer by layer (benchmark model)."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

BATCH_SIZE = 128


class LeNet(nn.Layer):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2D(1, 6, 3, stride=1, padding=1), nn.ReLU(), nn.MaxPool2D(2, 2),
            nn.Conv2D(6, 16, 5, stride=1, padding=0), nn.ReLU(), nn.MaxPool2D(2, 2),
        )
        self.fc = nn.Sequential(nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = paddle.flatten(x, 1)
        return self.fc(x)


def main():
    model = LeNet()
    opt = paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9, parameters=model.parameters())
    for _ in range(3):
        x = paddle.randn([BATCH_SIZE, 1, 28, 28])
        y = paddle.randint(0, 10, [BATCH_SIZE, 1])
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
