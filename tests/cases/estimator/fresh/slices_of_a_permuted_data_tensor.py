# A fresh user's style (trial of the batch warnings): micro-batches of 50 sliced from a 2000-row data set the
# script creates and permutes every epoch; spec-batch-not-used said "the script uses batch 2000 ... set the spec
# to 2000", also under a spec of 50 (the dry run shrank the 2000 rows, so its reading of the steps was dropped)
import numpy as np
import paddle

N, MB = 2000, 50
X = paddle.randn([N, 64])
W = paddle.randn([64, 1])
Y = X @ W + 0.1 * paddle.randn([N, 1])
model = paddle.nn.Sequential(paddle.nn.Linear(64, 256), paddle.nn.GELU(), paddle.nn.Linear(256, 1))
opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
for ep in range(5):
    perm = paddle.randperm(N)
    Xs, Ys = X[perm], Y[perm]
    for i in range(0, N, MB):
        xb, yb = Xs[i:i + MB], Ys[i:i + MB]
        loss = paddle.nn.functional.mse_loss(model(xb), yb)
        loss.backward(); opt.step(); opt.clear_grad()
    print("epoch", ep, float(loss))
