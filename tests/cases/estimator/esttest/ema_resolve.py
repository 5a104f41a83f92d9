"""Critic training with a gradient penalty (paddle.grad, create_graph=True), an EMA copy of the model,
a log file and checkpoints written next to the script every few steps; runs on the GPU."""
import copy
import logging
import os
from pathlib import Path

import paddle
import paddle.nn as nn

paddle.set_device("gpu:0")
OUT = str(Path(__file__).resolve().parent / "runs" / "critic")
os.makedirs(OUT, exist_ok=True)
logging.basicConfig(filename=os.path.join(OUT, "train.log"), level=logging.INFO)
log = logging.getLogger("critic")

BATCH, SIZE = 32, 64


class Critic(nn.Layer):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2D(3, 64, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2D(64, 128, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2D(128, 256, 4, 2, 1), nn.LeakyReLU(0.2))
        self.fc = nn.Linear(256 * (SIZE // 8) ** 2, 1)

    def forward(self, x):
        h = self.net(x)
        return self.fc(h.reshape([h.shape[0], -1]))


critic = Critic()
ema = copy.deepcopy(critic)
for p in ema.parameters():
    p.stop_gradient = True
opt = paddle.optimizer.Adam(learning_rate=1e-4, beta1=0.0, beta2=0.9, parameters=critic.parameters())

for step in range(6):
    real = paddle.randn([BATCH, 3, SIZE, SIZE])
    fake = paddle.randn([BATCH, 3, SIZE, SIZE])
    alpha = paddle.rand([BATCH, 1, 1, 1])
    mix = alpha * real + (1 - alpha) * fake
    mix.stop_gradient = False
    score = critic(mix)
    (g,) = paddle.grad(outputs=score.sum(), inputs=mix, create_graph=True)
    gp = ((g.reshape([BATCH, -1]).norm(2, axis=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10.0 * gp
    loss.backward()
    opt.step()
    opt.clear_grad()
    with paddle.no_grad():
        for pe, pc in zip(ema.parameters(), critic.parameters()):
            pe.set_value(0.999 * pe + 0.001 * pc)
    log.info("step %d loss %.4f gp %.4f", step, float(loss), float(gp))
    if step % 3 == 2:
        paddle.save(critic.state_dict(), os.path.join(OUT, f"critic_{step}.pdparams"))
        paddle.save(ema.state_dict(), os.path.join(OUT, "ema_last.pdparams"))
print("done")
