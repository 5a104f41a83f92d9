"""Data-parallel CNN: init_parallel_env, DataParallel, DistributedBatchSampler; batch from AUTODL_BATCH_SIZE_PER_GPU."""
import os

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, DistributedBatchSampler, Dataset

BATCH = int(os.environ.get("AUTODL_BATCH_SIZE_PER_GPU", 48))


class Images(Dataset):
    def __len__(self):
        return 1024

    def __getitem__(self, i):
        return np.random.rand(3, 48, 48).astype("float32"), np.array([i % 10], dtype="int64")


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2D(3, 64, 3, padding=1)
        self.c2 = nn.Conv2D(64, 128, 3, padding=1)
        self.c3 = nn.Conv2D(128, 128, 3, padding=1)
        self.fc = nn.Linear(128 * 6 * 6, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.max_pool2d(F.relu(self.c3(x)), 2)
        return self.fc(x.flatten(1))


def train():
    dist.init_parallel_env()
    model = paddle.DataParallel(Net())
    opt = paddle.optimizer.Adam(parameters=model.parameters())
    data = Images()
    loader = DataLoader(data, batch_sampler=DistributedBatchSampler(data, batch_size=BATCH, shuffle=True))
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    train()
