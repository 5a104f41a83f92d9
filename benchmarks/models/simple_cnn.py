"""Example CNN on CIFAR-10-sized inputs (benchmark model)."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

BATCH_SIZE = 64


class SimpleCNN(nn.Layer):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2D(3, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2D(32)
        self.conv2 = nn.Conv2D(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2D(64)
        self.pool = nn.MaxPool2D(2)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 16 * 16, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = paddle.flatten(x, 1)
        x = self.dropout(F.relu(self.fc1(x)))
        return self.fc2(x)


def main():
    model = SimpleCNN()
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    for _ in range(3):
        x = paddle.randn([BATCH_SIZE, 3, 32, 32])
        y = paddle.randint(0, 10, [BATCH_SIZE, 1])
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
