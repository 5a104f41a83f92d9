# A model that computes with paddle.einsum only (no Linear/Conv layer, no paddle.matmul): what autodl counts as
# FLOPs sees nothing of it; the profile's FLOPs are unknown and said so, not 0
import paddle
import paddle.nn as nn


class Bilinear(nn.Layer):
    def __init__(self):
        super().__init__()
        self.w1 = self.create_parameter([64, 256])
        self.w2 = self.create_parameter([256, 10])

    def forward(self, x):
        return paddle.einsum("bh,hk->bk", paddle.nn.functional.relu(paddle.einsum("bi,ih->bh", x, self.w1)), self.w2)


model = Bilinear()
opt = paddle.optimizer.Adam(1e-3, parameters=model.parameters())
data = paddle.io.TensorDataset([paddle.randn([512, 64]), paddle.randint(0, 10, [512, 1])])
for epoch in range(2):
    for x, y in paddle.io.DataLoader(data, batch_size=32):
        loss = paddle.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
