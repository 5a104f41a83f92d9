"""Denoising convolutional autoencoder (Conv-BN-ReLU encoder, Conv2DTranspose decoder) for 64x64 grayscale
patches, hyper-parameters read from configs/autoencoder.json beside the script.

Written in the older Paddle 2.0 idiom: optimizer.minimize(loss) and model.clear_gradients().
Momentum with L2 weight decay.
"""
import json
import os
import sys

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, TensorDataset


def load_config():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "configs", "autoencoder.json")
    with open(path) as f:
        return json.load(f)


class ConvAutoencoder(nn.Layer):
    def __init__(self, in_ch, chans, latent, hw):
        super().__init__()
        enc, c = [], in_ch
        for out in chans:
            enc += [nn.Conv2D(c, out, 3, stride=2, padding=1), nn.BatchNorm2D(out), nn.ReLU()]
            c = out
        self.encoder = nn.Sequential(*enc)
        self.small = hw // (2 ** len(chans))
        self.to_latent = nn.Linear(c * self.small * self.small, latent)
        self.from_latent = nn.Linear(latent, c * self.small * self.small)
        dec = []
        for out in list(reversed(chans[:-1])) + [in_ch]:
            dec += [nn.Conv2DTranspose(c, out, 4, stride=2, padding=1)]
            if out != in_ch:
                dec += [nn.BatchNorm2D(out), nn.ReLU()]
            c = out
        self.decoder = nn.Sequential(*dec)
        self.last_c = chans[-1]

    def forward(self, x):
        z = self.to_latent(self.encoder(x).flatten(1))
        h = self.from_latent(z).reshape([-1, self.last_c, self.small, self.small])
        return F.sigmoid(self.decoder(h))


cfg = load_config()
inp = cfg["input"]
clean = paddle.rand([cfg["batch_size"] * cfg["iterations"], inp["channels"], inp["height"], inp["width"]])
loader = DataLoader(TensorDataset([clean]), batch_size=cfg["batch_size"], shuffle=True)

model = ConvAutoencoder(inp["channels"], cfg["encoder_channels"], cfg["latent_dim"], inp["height"])
optimizer = paddle.optimizer.Momentum(learning_rate=cfg["learning_rate"], momentum=cfg["momentum"],
                                      parameters=model.parameters(),
                                      weight_decay=paddle.regularizer.L2Decay(cfg["weight_decay"]))
model.train()
for it, (batch,) in enumerate(loader):
    noisy = (batch + 0.2 * paddle.randn(batch.shape)).clip(0.0, 1.0)
    recon = model(noisy)
    loss = F.mse_loss(recon, batch)
    loss.backward()
    optimizer.minimize(loss)
    model.clear_gradients()
    print(f"iter {it}: mse {loss.item():.5f}")
