"""ResNet-18 on 64x64 images at batch 256 from a DataLoader (too large to run whole in a CPU dry run)."""
import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.vision.models import resnet18

BATCH_SIZE = 256


class Tiles(paddle.io.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return np.random.rand(3, 64, 64).astype("float32"), np.array([i % 200], dtype="int64")


def main():
    model = resnet18(num_classes=200)
    opt = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, weight_decay=5e-4, parameters=model.parameters())
    loader = paddle.io.DataLoader(Tiles(), batch_size=BATCH_SIZE, shuffle=True, drop_last=True)
    model.train()
    for images, labels in loader:
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
