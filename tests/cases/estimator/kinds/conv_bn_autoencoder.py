"""Conv-BN-ReLU autoencoder on 64x64 grayscale images from a Dataset; everything at module level."""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


class Faces(paddle.io.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return np.random.rand(1, 64, 64).astype("float32")


def cbr(cin, cout, stride=1):
    return [nn.Conv2D(cin, cout, 3, stride=stride, padding=1, bias_attr=False), nn.BatchNorm2D(cout), nn.ReLU()]


encoder = nn.Sequential(*cbr(1, 32), *cbr(32, 64, 2), *cbr(64, 128, 2), *cbr(128, 128, 2))
decoder = nn.Sequential(nn.Conv2DTranspose(128, 64, 4, stride=2, padding=1), nn.BatchNorm2D(64), nn.ReLU(),
                        nn.Conv2DTranspose(64, 32, 4, stride=2, padding=1), nn.BatchNorm2D(32), nn.ReLU(),
                        nn.Conv2DTranspose(32, 1, 4, stride=2, padding=1))
model = nn.Sequential(encoder, decoder)
opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
loader = paddle.io.DataLoader(Faces(), batch_size=32, shuffle=True)
for epoch in range(1):
    for img in loader:
        img = img[0] if isinstance(img, (list, tuple)) else img
        loss = F.mse_loss(F.sigmoid(model(img)), img)
        loss.backward()
        opt.step()
        opt.clear_grad()
