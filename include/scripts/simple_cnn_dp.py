"""The small CNN trained data-parallel: one process per device under ``python -m paddle.distributed.launch``.

Each rank holds the whole model and its own batch of ``BATCH_SIZE`` (per card); gradients are
all-reduced. Synthetic CIFAR-shaped data, no download. On CPU (declared pool) it runs as one process.
"""

import argparse
import json
import os
import time

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, DistributedBatchSampler, TensorDataset

BATCH_SIZE = 64


class SimpleCNN(nn.Layer):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2D(3, 32, kernel_size=3, padding=1), nn.BatchNorm2D(32), nn.ReLU(), nn.MaxPool2D(2, 2),
            nn.Conv2D(32, 64, kernel_size=3, padding=1), nn.BatchNorm2D(64), nn.ReLU(), nn.MaxPool2D(2, 2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def report_step(step: int, samples: int) -> None:
    """Append one step to $AUTODL_METRICS_FILE (set by autodl's launcher) so step time is measured."""
    path = os.environ.get("AUTODL_METRICS_FILE")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"step": step, "samples": samples, "t": time.time()}) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    paddle.set_device(os.environ.get("AUTODL_PADDLE_DEVICE", "cpu"))
    distributed = dist.get_world_size() > 1
    if distributed:
        dist.init_parallel_env()
    rng = np.random.default_rng(0)
    images = paddle.to_tensor(rng.standard_normal((args.samples, 3, 32, 32)).astype("float32"))
    labels = paddle.to_tensor(rng.integers(0, 10, (args.samples,)).astype("int64"))
    dataset = TensorDataset([images, labels])
    sampler = DistributedBatchSampler(dataset, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)
    loader = DataLoader(dataset, batch_sampler=sampler)
    model = SimpleCNN()
    if distributed:
        model = paddle.DataParallel(model)
    opt = paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9, parameters=model.parameters())
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            report_step(step, int(x.shape[0]))
            if step % 2 == 0:
                print(f"rank {dist.get_rank()} epoch {epoch} step {step} loss {float(loss):.4f}", flush=True)
    print(f"done on {paddle.get_device()} with {dist.get_world_size()} rank(s)", flush=True)


if __name__ == "__main__":
    main()
