"""Classifier trained on 96x96 crops (batch 8) and validated on 320x320 images (batch 16) under no_grad."""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset


class Pictures(Dataset):
    def __init__(self, size, n):
        self.size, self.n = size, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.random.rand(3, self.size, self.size).astype("float32"), np.array([i % 37], dtype="int64")


class Net(nn.Layer):
    def __init__(self, classes=37):
        super().__init__()
        chans = [3, 32, 64, 128, 256]
        self.stages = nn.LayerList([nn.Sequential(nn.Conv2D(a, b, 3, padding=1), nn.BatchNorm2D(b), nn.ReLU(),
                                                  nn.Conv2D(b, b, 3, padding=1), nn.BatchNorm2D(b), nn.ReLU(),
                                                  nn.MaxPool2D(2)) for a, b in zip(chans, chans[1:])])
        self.fc = nn.Linear(256, classes)

    def forward(self, x):
        for s in self.stages:
            x = s(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def evaluate(model, loader):
    model.eval()
    hits = 0
    with paddle.no_grad():
        for x, y in loader:
            hits += int((model(x).argmax(1) == y.flatten()).sum())
    model.train()
    return hits


def main():
    model = Net()
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    train = DataLoader(Pictures(96, 256), batch_size=8, shuffle=True)
    val = DataLoader(Pictures(320, 64), batch_size=16)
    for epoch in range(2):
        for x, y in train:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
        print(epoch, evaluate(model, val))


if __name__ == "__main__":
    main()
