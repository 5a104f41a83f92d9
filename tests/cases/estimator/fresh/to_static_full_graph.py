# A model whose forward is compiled with paddle.jit.to_static(full_graph=True); trained on a DataLoader.
# (fresh-script kind: the dry run's FLOPs hooks called int(numel()) on graph values and failed the script)
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2D(3, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 16 * 16, 10)

    @paddle.jit.to_static(full_graph=True)
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


class Images(paddle.io.Dataset):
    def __init__(self, n):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 3, 32, 32)).astype("float32")
        self.y = rng.integers(0, 10, n)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], np.int64(self.y[i])


if __name__ == "__main__":
    paddle.seed(0)
    model = Net()
    opt = paddle.optimizer.Adam(1e-3, parameters=model.parameters())
    for x, y in paddle.io.DataLoader(Images(16 * 5), batch_size=16, drop_last=True):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
