"""A small CNN image classifier trained with PaddlePaddle on synthetic CIFAR-shaped data (no download).

autodl pins the process to its booked device(s) and says which Paddle device to use in
AUTODL_PADDLE_DEVICE ('cpu' when the pool is declared rather than real).
"""

import argparse
import json
import os
import time

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset

BATCH_SIZE = 64
NUM_CLASSES = 10


class SyntheticCIFAR(Dataset):
    """Random 3x32x32 images with labels that depend on the image, so the loss can fall."""

    def __init__(self, num_samples: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.images = rng.standard_normal((num_samples, 3, 32, 32)).astype("float32")
        self.labels = (self.images[:, 0, :4, :4].sum(axis=(1, 2)) > 0).astype("int64") * 3

    def __getitem__(self, idx):
        return self.images[idx], self.labels[idx]

    def __len__(self):
        return len(self.images)


class SimpleCNN(nn.Layer):
    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2D(3, 32, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2D(32)
        self.conv2 = nn.Conv2D(32, 64, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2D(64)
        self.pool = nn.MaxPool2D(kernel_size=2, stride=2)
        self.fc1 = nn.Linear(64 * 8 * 8, 256)
        self.dropout = nn.Dropout(0.2)
        self.fc2 = nn.Linear(256, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = paddle.flatten(x, start_axis=1)
        x = self.dropout(F.relu(self.fc1(x)))
        return self.fc2(x)


def report_step(step: int, samples: int) -> None:
    """Append one step to $AUTODL_METRICS_FILE (set by autodl's launcher) so step time is measured."""
    path = os.environ.get("AUTODL_METRICS_FILE")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"step": step, "samples": samples, "t": time.time()}) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    paddle.set_device(os.environ.get("AUTODL_PADDLE_DEVICE", "cpu"))
    paddle.seed(0)
    model = SimpleCNN()
    loader = DataLoader(SyntheticCIFAR(args.samples), batch_size=args.batch_size, shuffle=True, drop_last=True)
    opt = paddle.optimizer.Adam(learning_rate=args.lr, parameters=model.parameters())
    start = time.time()
    for epoch in range(args.epochs):
        for step, (images, labels) in enumerate(loader):
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            opt.clear_grad()
            report_step(step, int(images.shape[0]))
            if step % 2 == 0:
                print(f"epoch {epoch} step {step} loss {float(loss):.4f}", flush=True)
    print(f"done: {args.epochs} epoch(s) in {time.time() - start:.2f} s on {paddle.get_device()}", flush=True)


if __name__ == "__main__":
    main()
