# Multi-task learning with two DataLoaders, one per task, alternating batch by batch (round-robin) through a shared
# Transformer encoder with one head per task (sentence classification / token tagging). The two tasks' batches have
# different shapes. Hyper-parameters from an INI file read with configparser.
import configparser
import os

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

cfg = configparser.ConfigParser()
cfg.read(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "multitask.ini"))
ENC, CLS, TAG, TRAIN = cfg["encoder"], cfg["cls"], cfg["tag"], cfg["train"]


class ClsData(paddle.io.Dataset):
    def __init__(self):
        r = np.random.default_rng(TRAIN.getint("seed"))
        self.ids = r.integers(1, ENC.getint("vocab_size"), (CLS.getint("num_examples"), CLS.getint("seq_len")))
        self.y = r.integers(0, CLS.getint("num_classes"), CLS.getint("num_examples"))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.ids[i].astype("int64"), np.int64(self.y[i])


class TagData(paddle.io.Dataset):
    def __init__(self):
        r = np.random.default_rng(TRAIN.getint("seed") + 1)
        n, t = TAG.getint("num_examples"), TAG.getint("seq_len")
        self.ids = r.integers(1, ENC.getint("vocab_size"), (n, t))
        self.tags = r.integers(0, TAG.getint("num_tags"), (n, t))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i].astype("int64"), self.tags[i].astype("int64")


class SharedEncoderMTL(nn.Layer):
    def __init__(self):
        super().__init__()
        d = ENC.getint("d_model")
        self.tok = nn.Embedding(ENC.getint("vocab_size"), d)
        self.pos = nn.Embedding(512, d)
        layer = nn.TransformerEncoderLayer(d, ENC.getint("heads"), ENC.getint("ffn"), dropout=0.1, activation="gelu",
                                           normalize_before=True)
        self.encoder = nn.TransformerEncoder(layer, ENC.getint("layers"), norm=nn.LayerNorm(d))
        self.heads = nn.LayerDict({"cls": nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, CLS.getint("num_classes"))),
                                   "tag": nn.Linear(d, TAG.getint("num_tags"))})

    def forward(self, ids, task):
        pos = paddle.arange(ids.shape[1]).unsqueeze(0)
        h = self.encoder(self.tok(ids) + self.pos(pos))
        return self.heads["cls"](h.mean(1)) if task == "cls" else self.heads["tag"](h)


def round_robin(*loaders):
    """One batch of each task in turn until the longest loader is exhausted (shorter ones restart)."""
    its = [iter(dl) for dl in loaders]
    for _ in range(max(len(dl) for dl in loaders)):
        for k, dl in enumerate(loaders):
            try:
                yield k, next(its[k])
            except StopIteration:
                its[k] = iter(dl)
                yield k, next(its[k])


if __name__ == "__main__":
    paddle.seed(TRAIN.getint("seed"))
    np.random.seed(TRAIN.getint("seed"))
    cls_loader = paddle.io.DataLoader(ClsData(), batch_size=CLS.getint("batch_size"), shuffle=True)
    tag_loader = paddle.io.DataLoader(TagData(), batch_size=TAG.getint("batch_size"), shuffle=True)
    model = SharedEncoderMTL()
    opt = paddle.optimizer.Adam(TRAIN.getfloat("lr"), parameters=model.parameters(),
                                grad_clip=nn.ClipGradByGlobalNorm(1.0))
    task_weight = {"cls": 1.0, "tag": 0.5}
    for epoch in range(TRAIN.getint("epochs")):
        for step, (k, (ids, y)) in enumerate(round_robin(cls_loader, tag_loader)):
            task = ("cls", "tag")[k]
            logits = model(ids, task=task)
            loss = F.cross_entropy(logits, y.unsqueeze(-1) if task == "tag" else y) * task_weight[task]
            loss.backward()
            opt.step()
            opt.clear_grad()
            print(f"epoch {epoch} step {step} task {task} loss {float(loss):.4f}")
