"""DCGAN on 64x64 images: a generator and a discriminator, each with its own Adam optimizer."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

NZ, NGF, NDF, BATCH = 100, 64, 64, 16


class G(nn.Layer):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2DTranspose(NZ, NGF * 8, 4, 1, 0, bias_attr=False), nn.BatchNorm2D(NGF * 8), nn.ReLU(),
            nn.Conv2DTranspose(NGF * 8, NGF * 4, 4, 2, 1, bias_attr=False), nn.BatchNorm2D(NGF * 4), nn.ReLU(),
            nn.Conv2DTranspose(NGF * 4, NGF * 2, 4, 2, 1, bias_attr=False), nn.BatchNorm2D(NGF * 2), nn.ReLU(),
            nn.Conv2DTranspose(NGF * 2, NGF, 4, 2, 1, bias_attr=False), nn.BatchNorm2D(NGF), nn.ReLU(),
            nn.Conv2DTranspose(NGF, 3, 4, 2, 1, bias_attr=False), nn.Tanh())

    def forward(self, z):
        return self.net(z)


class D(nn.Layer):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2D(3, NDF, 4, 2, 1, bias_attr=False), nn.LeakyReLU(0.2),
            nn.Conv2D(NDF, NDF * 2, 4, 2, 1, bias_attr=False), nn.BatchNorm2D(NDF * 2), nn.LeakyReLU(0.2),
            nn.Conv2D(NDF * 2, NDF * 4, 4, 2, 1, bias_attr=False), nn.BatchNorm2D(NDF * 4), nn.LeakyReLU(0.2),
            nn.Conv2D(NDF * 4, NDF * 8, 4, 2, 1, bias_attr=False), nn.BatchNorm2D(NDF * 8), nn.LeakyReLU(0.2),
            nn.Conv2D(NDF * 8, 1, 4, 1, 0, bias_attr=False))

    def forward(self, x):
        return self.net(x).flatten()


def main():
    netG, netD = G(), D()
    optD = paddle.optimizer.Adam(learning_rate=2e-4, beta1=0.5, parameters=netD.parameters())
    optG = paddle.optimizer.Adam(learning_rate=2e-4, beta1=0.5, parameters=netG.parameters())
    for it in range(4):
        real = paddle.rand([BATCH, 3, 64, 64]) * 2 - 1
        z = paddle.randn([BATCH, NZ, 1, 1])
        fake = netG(z)
        d_loss = F.binary_cross_entropy_with_logits(netD(real), paddle.ones([BATCH])) + \
            F.binary_cross_entropy_with_logits(netD(fake.detach()), paddle.zeros([BATCH]))
        d_loss.backward()
        optD.step()
        optD.clear_grad()
        g_loss = F.binary_cross_entropy_with_logits(netD(fake), paddle.ones([BATCH]))
        g_loss.backward()
        optG.step()
        optG.clear_grad()
        optD.clear_grad()


if __name__ == "__main__":
    main()
