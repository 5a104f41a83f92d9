"""A CNN compiled with paddle.jit.to_static, trained in dygraph-to-static mode."""
import numpy as np
import paddle
import paddle.nn as nn
MEAN_STD = np.load("/mnt/datasets/norm_stats.npy")  # normalisation stats from the data volume

BATCH = 24


class ConvNet(nn.Layer):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2D(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
            nn.Conv2D(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
            nn.Conv2D(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2D(1))
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(paddle.flatten(self.features(x), 1))


net = ConvNet()
net = paddle.jit.to_static(net, input_spec=[paddle.static.InputSpec([None, 3, 96, 96], "float32")])
opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=net.parameters())
for step in range(5):
    x = paddle.to_tensor(np.random.rand(BATCH, 3, 96, 96).astype("float32"))
    y = paddle.to_tensor(np.random.randint(0, 10, (BATCH, 1)).astype("int64"))
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    opt.clear_grad()
    print(step, float(loss))
