"""LeNet trained with the high-level API: paddle.Model(...).prepare(...).fit(train, eval) (an eval pass per epoch)."""
import numpy as np
import paddle
from paddle.metric import Accuracy
from paddle.vision.models import LeNet


class Digits(paddle.io.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.random.rand(1, 28, 28).astype("float32"), np.array([i % 10], dtype="int64")


if __name__ == "__main__":
    model = paddle.Model(LeNet())
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    model.prepare(opt, paddle.nn.CrossEntropyLoss(), Accuracy())
    model.fit(Digits(2048), Digits(512), batch_size=128, epochs=2, verbose=0)
