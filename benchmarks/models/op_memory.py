"""Per-op activation memory on Paddle CPU: allocator peak of one training step, in units of 64K floats per sample."""
import sys, paddle, paddle.nn as nn, paddle.nn.functional as F
from paddle.base import core
paddle.set_device('cpu')
B=16
def meas(name, m, mk):
    ps=[p for p in m.parameters()] if isinstance(m, nn.Layer) else []
    opt = paddle.optimizer.SGD(parameters=ps) if ps else None
    def step():
        x = mk()
        out = m(x)
        if isinstance(out,(tuple,list)): out=out[0]
        out.astype('float32').mean().backward()
        if opt: opt.step(); opt.clear_grad()
    step()
    core.host_memory_stat_reset_peak_value("Allocated", 0)
    base = core.host_memory_stat_current_value("Allocated", 0)
    step()
    pk = core.host_memory_stat_peak_value("Allocated", 0)
    return pk-base
def xin(*s, grad=True):
    def f():
        t = paddle.randn([B,*s]); t.stop_gradient = not grad; return t
    return f
N=64*1024*4  # bytes per sample for 64K floats
tests = {
 'relu': (nn.ReLU(), xin(65536)),
 'gelu': (nn.GELU(), xin(65536)),
 'tanh': (nn.Tanh(), xin(65536)),
 'sigmoid': (nn.Sigmoid(), xin(65536)),
 'softmax': (nn.Softmax(), xin(256,256)),
 'dropout': (nn.Dropout(0.1), xin(65536)),
 'flatten': (lambda x: paddle.flatten(x,1)*1.0, xin(256,256)),
 'reshape': (lambda x: x.reshape([B,-1])*1.0, xin(256,256)),
 'transpose': (lambda x: x.transpose([0,2,1])*1.0, xin(256,256)),
 'mul1': (lambda x: x*1.0, xin(65536)),
 'add': (lambda x: x+x, xin(65536)),
 'linear': (nn.Linear(256,256), xin(256,256)),
 'linear_nobias': (nn.Linear(256,256,bias_attr=False), xin(256,256)),
 'layernorm': (nn.LayerNorm(256), xin(256,256)),
 'bn': (nn.BatchNorm2D(64), xin(64,32,32)),
 'conv': (nn.Conv2D(64,64,3,padding=1), xin(64,32,32)),
 'maxpool': (nn.MaxPool2D(2), xin(64,32,32)),
 'avgpool': (nn.AvgPool2D(2), xin(64,32,32)),
 'matmulT': (lambda x: paddle.matmul(x, x, transpose_y=True), xin(256,256)),
 'slice': (lambda x: x[:, :128]*1.0, xin(256,256)),
 'concat': (lambda x: paddle.concat([x,x],axis=1), xin(256,256)),
 'nograd_relu': (nn.ReLU(), xin(65536, grad=False)),
 'mha': (nn.MultiHeadAttention(256, 4), xin(256,256)),
 'enc': (nn.TransformerEncoderLayer(256, 4, 1024), xin(256,256)),
 'enc_nodrop': (nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0), xin(256,256)),
 'lstm': (nn.LSTM(256, 256), xin(256,256)),
 'gru': (nn.GRU(256, 256), xin(256,256)),
 'embed': (nn.Embedding(1000, 256), lambda: paddle.randint(0,1000,[B,256])),
 'sdpa': (lambda x: F.scaled_dot_product_attention(x.reshape([B,256,4,64]),x.reshape([B,256,4,64]),x.reshape([B,256,4,64]), is_causal=True), xin(256,256)),
}
for k in (sys.argv[1:] or tests):
    m, mk = tests[k]
    v = meas(k, m, mk)
    print(f"{k:14s} {v/B:12.0f} per sample = {v/B/N:.3f} x 64K floats", flush=True)
