"""Models for train.py (kept in their own module, as projects do)."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


class ResBlock(nn.Layer):
    def __init__(self, ch):
        super().__init__()
        self.c1 = nn.Conv2D(ch, ch, 3, padding=1, bias_attr=False)
        self.b1 = nn.BatchNorm2D(ch)
        self.c2 = nn.Conv2D(ch, ch, 3, padding=1, bias_attr=False)
        self.b2 = nn.BatchNorm2D(ch)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(x + y)


class Net(nn.Layer):
    def __init__(self, width=48, blocks=3, num_classes=20):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2D(3, width, 3, stride=2, padding=1), nn.BatchNorm2D(width), nn.ReLU())
        self.body = nn.Sequential(*[ResBlock(width) for _ in range(blocks)])
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        x = self.body(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)
