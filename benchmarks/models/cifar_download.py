"""A ResNet-ish CNN on paddle.vision.datasets.Cifar10, which downloads its data on first use."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import paddle.vision.transforms as T
from paddle.vision.datasets import Cifar10


class Res(nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.a = nn.Conv2D(c, c, 3, padding=1)
        self.b = nn.Conv2D(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2D(c)

    def forward(self, x):
        return F.relu(x + self.bn(self.b(F.relu(self.a(x)))))


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2D(3, 64, 3, padding=1)
        self.layers = nn.Sequential(Res(64), nn.MaxPool2D(2), Res(64), nn.MaxPool2D(2), Res(64))
        self.fc = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(paddle.flatten(self.layers(F.relu(self.stem(x))), 1))


if __name__ == "__main__":
    transform = T.Compose([T.Transpose(), T.Normalize(mean=[127.5] * 3, std=[127.5] * 3)])
    train = Cifar10(mode="train", transform=transform, download=True)
    model = Net()
    opt = paddle.optimizer.Momentum(learning_rate=0.01, parameters=model.parameters())
    for x, y in paddle.io.DataLoader(train, batch_size=128, shuffle=True):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
