"""paddle.vision.models.squeezenet1_1 wrapped in paddle.DataParallel, launchable with
`python -m paddle.distributed.launch` or plainly with `python squeezenet_dataparallel.py` (one process).

The parallel environment is initialised only when there is more than one trainer; a DistributedBatchSampler
shards the data.  Adam with a cosine schedule; 160x160 inputs.
"""
import numpy as np
import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset, DistributedBatchSampler
from paddle.vision.models import squeezenet1_1


class Images(Dataset):
    def __init__(self, n, size=160, classes=200):
        self.n, self.size, self.classes = n, size, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return (np.random.rand(3, self.size, self.size).astype("float32"),
                np.array([i % self.classes], dtype="int64"))


def main():
    world = dist.get_world_size()
    if world > 1:
        dist.init_parallel_env()
    rank = dist.get_rank()

    model = squeezenet1_1(num_classes=200)
    model = paddle.DataParallel(model)  # a no-op wrapper (with a warning) when there is one trainer

    ds = Images(n=48 * max(world, 1))
    sampler = DistributedBatchSampler(ds, batch_size=24, shuffle=True, drop_last=True)
    loader = DataLoader(ds, batch_sampler=sampler)
    sched = paddle.optimizer.lr.CosineAnnealingDecay(learning_rate=1e-3, T_max=10)
    opt = paddle.optimizer.Adam(learning_rate=sched, parameters=model.parameters())

    for epoch in range(3):
        sampler.set_epoch(epoch)
        model.train()
        for step, (img, label) in enumerate(loader):
            loss = F.cross_entropy(model(img), label)
            loss.backward()
            opt.step()
            opt.clear_grad()
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        sched.step()


if __name__ == "__main__":
    main()
