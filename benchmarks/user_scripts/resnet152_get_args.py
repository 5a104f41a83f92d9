"""Fine-tune paddle.vision.models.resnet152 (10 classes, from scratch) on 128x128 product photos.

Arguments are parsed inside a helper, get_args(); images come from a Dataset through a DataLoader.
Momentum with Nesterov, cosine annealing, coupled L2 weight decay given as a float.
"""
import argparse

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset
from paddle.vision.models import resnet152


def get_args():
    parser = argparse.ArgumentParser(description="ResNet-152 classifier")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--image_size", type=int, default=128)
    parser.add_argument("--num_classes", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--weight_decay", type=float, default=1e-4)
    parser.add_argument("--samples", type=int, default=24)
    return parser.parse_args()


class ProductImages(Dataset):
    MEAN = np.array([0.485, 0.456, 0.406], dtype="float32").reshape(3, 1, 1)
    STD = np.array([0.229, 0.224, 0.225], dtype="float32").reshape(3, 1, 1)

    def __init__(self, n, size, num_classes):
        self.n, self.size, self.num_classes = n, size, num_classes

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        img = np.random.randint(0, 256, (3, self.size, self.size)).astype("float32") / 255.0
        img = (img - self.MEAN) / self.STD
        return img, np.array([idx % self.num_classes], dtype="int64")


def train_one_epoch(model, loader, optimizer, scheduler, epoch):
    model.train()
    for i, (images, target) in enumerate(loader):
        output = model(images)
        loss = F.cross_entropy(output, target)
        optimizer.clear_grad()
        loss.backward()
        optimizer.step()
        acc = paddle.metric.accuracy(F.softmax(output), target)
        print(f"Epoch[{epoch}] iter {i}: loss {loss.item():.4f} acc {acc.item():.3f} lr {scheduler.get_lr():.5f}")
    scheduler.step()


def main():
    args = get_args()
    model = resnet152(num_classes=args.num_classes)
    loader = DataLoader(ProductImages(args.samples, args.image_size, args.num_classes),
                        batch_size=args.batch_size, shuffle=True, drop_last=True)
    scheduler = paddle.optimizer.lr.CosineAnnealingDecay(learning_rate=args.lr, T_max=args.epochs)
    optimizer = paddle.optimizer.Momentum(learning_rate=scheduler, momentum=0.9, use_nesterov=True,
                                          parameters=model.parameters(), weight_decay=args.weight_decay)
    for epoch in range(args.epochs):
        train_one_epoch(model, loader, optimizer, scheduler, epoch)


if __name__ == "__main__":
    main()
