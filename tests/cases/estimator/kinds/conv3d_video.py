"""Small 3-D CNN for video clips (C3D-style), clips of 8 frames at 56x56, argparse."""
import argparse

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--frames", type=int, default=8)
parser.add_argument("--size", type=int, default=56)
parser.add_argument("--classes", type=int, default=101)


def block(cin, cout, pool=(1, 2, 2)):
    return nn.Sequential(nn.Conv3D(cin, cout, 3, padding=1), nn.BatchNorm3D(cout), nn.ReLU(), nn.MaxPool3D(pool, pool))


class C3D(nn.Layer):
    def __init__(self, classes):
        super().__init__()
        self.features = nn.Sequential(block(3, 32), block(32, 64, (2, 2, 2)), block(64, 128, (2, 2, 2)),
                                      nn.Conv3D(128, 128, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool3D(1)
        self.fc = nn.Linear(128, classes)

    def forward(self, clip):
        return self.fc(paddle.flatten(self.pool(self.features(clip)), 1))


if __name__ == "__main__":
    args = parser.parse_args()
    model = C3D(args.classes)
    opt = paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9, parameters=model.parameters())
    for it in range(3):
        clips = paddle.randn([args.batch_size, 3, args.frames, args.size, args.size])
        labels = paddle.randint(0, args.classes, [args.batch_size, 1])
        loss = F.cross_entropy(model(clips), labels)
        loss.backward()
        opt.step()
        opt.clear_grad()
