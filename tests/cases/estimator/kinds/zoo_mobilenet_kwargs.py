"""paddle.vision.models.mobilenet_v2 with scale=0.5 and 10 classes, on 96x96 images from a Dataset."""
import argparse

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.vision import models


class Crops(paddle.io.Dataset):
    def __init__(self, size):
        self.size = size

    def __len__(self):
        return 512

    def __getitem__(self, i):
        return np.random.rand(3, self.size, self.size).astype("float32"), np.array([i % 10], dtype="int64")


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--scale", type=float, default=0.5)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=32)
    return p.parse_args()


def main():
    args = get_args()
    net = models.mobilenet_v2(scale=args.scale, num_classes=10)
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=net.parameters())
    for images, labels in paddle.io.DataLoader(Crops(args.size), batch_size=args.batch_size, shuffle=True):
        loss = F.cross_entropy(net(images), labels)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
