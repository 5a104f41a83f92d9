"""Trainer class with fit(); the model lives in mymodels.py next to this file."""
import argparse

import numpy as np
import paddle
from paddle.io import DataLoader, Dataset

from mymodels import Net

MEAN_STD = np.load("/mnt/datasets/norm_stats.npy")  # normalisation stats from the data volume


class RandomImages(Dataset):
    def __init__(self, n, size, classes):
        self.n, self.size, self.classes = n, size, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = np.random.rand(3, self.size, self.size).astype("float32")
        return x, np.int64(i % self.classes)


class Trainer:
    def __init__(self, model, lr, batch_size, image_size, num_classes):
        self.model = model
        self.opt = paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9, parameters=model.parameters(),
                                             weight_decay=1e-4)
        self.loss_fn = paddle.nn.CrossEntropyLoss()
        self.train_loader = DataLoader(RandomImages(256, image_size, num_classes), batch_size=batch_size,
                                       shuffle=True, drop_last=True)
        self.val_loader = DataLoader(RandomImages(64, image_size, num_classes), batch_size=batch_size * 2)

    def train_one_epoch(self, max_steps):
        self.model.train()
        for step, (x, y) in enumerate(self.train_loader):
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.opt.step()
            self.opt.clear_grad()
            if step + 1 >= max_steps:
                break

    @paddle.no_grad()
    def validate(self):
        self.model.eval()
        correct = total = 0
        for x, y in self.val_loader:
            pred = self.model(x).argmax(-1)
            correct += int((pred == y).sum())
            total += y.shape[0]
        return correct / max(total, 1)

    def fit(self, epochs, max_steps):
        for ep in range(epochs):
            self.train_one_epoch(max_steps)
            acc = self.validate()
            print(f"epoch {ep} val acc {acc:.3f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--width", type=int, default=48)
    args = p.parse_args()
    model = Net(width=args.width, blocks=3, num_classes=20)
    Trainer(model, 0.05, args.batch_size, args.image_size, 20).fit(args.epochs, args.steps)


if __name__ == "__main__":
    main()
