"""Old-style static graph: paddle.enable_static, program_guard, Executor.run."""
import numpy as np
import paddle

paddle.enable_static()
BATCH, FEATS = 256, 784

main_prog, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main_prog, startup):
    x = paddle.static.data("x", [None, FEATS], "float32")
    y = paddle.static.data("y", [None, 1], "int64")
    h = paddle.static.nn.fc(x, 1024, activation="relu")
    h = paddle.static.nn.fc(h, 1024, activation="relu")
    h = paddle.static.nn.fc(h, 512, activation="relu")
    logits = paddle.static.nn.fc(h, 10)
    loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
    paddle.optimizer.Adam(learning_rate=1e-3).minimize(loss)

exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
for step in range(6):
    xb = np.random.rand(BATCH, FEATS).astype("float32")
    yb = np.random.randint(0, 10, (BATCH, 1)).astype("int64")
    (l,) = exe.run(main_prog, feed={"x": xb, "y": yb}, fetch_list=[loss])
    print(step, float(l))
