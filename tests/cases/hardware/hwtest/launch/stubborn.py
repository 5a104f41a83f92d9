"""Spawns grandchildren that ignore SIGTERM (one in a new session, one double-forked daemon), then trains slowly."""
import os, signal, subprocess, sys, time
import paddle
import paddle.nn as nn

signal.signal(signal.SIGTERM, signal.SIG_IGN)
marker = os.environ.get("HWTEST_MARK", "hwtest-stubborn")
code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)  # " + marker
kids = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True),
        subprocess.Popen([sys.executable, "-c", code])]
if os.fork() == 0:                     # double fork: a daemon re-parented away from us
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", code])
    os._exit(0)
print("children", [k.pid for k in kids], flush=True)
model = nn.Linear(16, 4)
opt = paddle.optimizer.SGD(parameters=model.parameters())
for step in range(100000):
    loss = model(paddle.randn([8, 16])).mean()
    loss.backward(); opt.step(); opt.clear_grad()
    time.sleep(1)
