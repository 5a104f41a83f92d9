"""CIFAR-10-sized classification with the high-level API: paddle.Model(...).prepare(...).fit(...).

paddle.vision.models.resnet18 (10 classes) on 32x32 images from a Dataset; Momentum with a piecewise schedule
and L2 decay; paddle.metric.Accuracy.
"""
import numpy as np
import paddle
import paddle.nn as nn
from paddle.io import Dataset
from paddle.metric import Accuracy
from paddle.vision.models import resnet18


class FakeCifar(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        return np.random.rand(3, 32, 32).astype("float32"), np.array([idx % 10], dtype="int64")


if __name__ == "__main__":
    paddle.seed(2024)
    net = resnet18(num_classes=10)
    model = paddle.Model(net, inputs=paddle.static.InputSpec([None, 3, 32, 32], "float32", "image"),
                         labels=paddle.static.InputSpec([None, 1], "int64", "label"))
    lr = paddle.optimizer.lr.PiecewiseDecay(boundaries=[100, 150], values=[0.1, 0.01, 0.001])
    optim = paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9, parameters=model.parameters(),
                                      weight_decay=paddle.regularizer.L2Decay(5e-4))
    model.prepare(optim, nn.CrossEntropyLoss(), Accuracy(topk=(1, 5)))
    model.fit(FakeCifar(640), epochs=1, batch_size=128, shuffle=True, verbose=1, log_freq=1)
