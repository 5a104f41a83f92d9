# Fashion-MNIST style classifier: everything at module level, the way a first notebook turns into a script.
import paddle
import paddle.nn as nn

paddle.seed(0)
BATCH = 256
EPOCHS = 1
STEPS = 6

model = nn.Sequential(
    nn.Conv2D(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
    nn.Conv2D(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
    nn.Flatten(),
    nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Dropout(0.5),
    nn.Linear(512, 10),
)
loss_fn = nn.CrossEntropyLoss()
opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())

for epoch in range(EPOCHS):
    for i in range(STEPS):
        x = paddle.rand([BATCH, 1, 28, 28])
        y = paddle.randint(0, 10, [BATCH, 1])
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        print(epoch, i, float(loss))
