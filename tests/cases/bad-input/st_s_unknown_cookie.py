# coding: no-such-codec
import paddle.nn as nn
class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 4)
        self.tag = 'x'
    def forward(self, x):
        return self.fc(x)
model = Net()
