# BERT-style sentence classifier fed HuggingFace/PaddleNLP-style dict batches: model(**batch) returns a dict.
# Config from environment variables (BATCH_SIZE, MAX_SEQ_LEN, EPOCHS), the way a launcher passes them.
import math
import os

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

BATCH_SIZE = int(os.environ.get("BATCH_SIZE", "16"))
MAX_SEQ_LEN = int(os.environ.get("MAX_SEQ_LEN", "128"))
EPOCHS = int(os.environ.get("EPOCHS", "1"))
VOCAB, HIDDEN, LAYERS, HEADS, FFN, LABELS = 30522, 384, 6, 6, 1536, 3


class FakeTokenizedDataset(paddle.io.Dataset):
    """What `tokenizer(text, padding='max_length', truncation=True)` hands back, one dict per example."""

    def __init__(self, n, seed=0):
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(16, MAX_SEQ_LEN + 1, n)
        self.ids = rng.integers(1000, VOCAB, (n, MAX_SEQ_LEN))
        self.labels = rng.integers(0, LABELS, n)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        n = self.lengths[i]
        ids = np.zeros(MAX_SEQ_LEN, "int64")
        ids[0], ids[1:n - 1], ids[n - 1] = 101, self.ids[i, 1:n - 1], 102
        mask = (np.arange(MAX_SEQ_LEN) < n).astype("int64")
        return {"input_ids": ids, "token_type_ids": np.zeros(MAX_SEQ_LEN, "int64"),
                "attention_mask": mask, "labels": np.int64(self.labels[i])}


class BertEmbeddings(nn.Layer):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN, padding_idx=0)
        self.position_embeddings = nn.Embedding(512, HIDDEN)
        self.token_type_embeddings = nn.Embedding(2, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, epsilon=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, input_ids, token_type_ids):
        pos = paddle.arange(input_ids.shape[1], dtype="int64").unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Layer):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.dropout = nn.Dropout(0.1)

    def split_heads(self, x):
        b, s, _ = x.shape
        return x.reshape([b, s, HEADS, HIDDEN // HEADS]).transpose([0, 2, 1, 3])

    def forward(self, h, ext_mask):
        q, k, v = self.split_heads(self.query(h)), self.split_heads(self.key(h)), self.split_heads(self.value(h))
        scores = paddle.matmul(q, k, transpose_y=True) / math.sqrt(HIDDEN // HEADS) + ext_mask
        ctx = paddle.matmul(self.dropout(F.softmax(scores, axis=-1)), v)
        b, _, s, _ = ctx.shape
        return self.out(ctx.transpose([0, 2, 1, 3]).reshape([b, s, HIDDEN]))


class BertLayer(nn.Layer):
    def __init__(self):
        super().__init__()
        self.attention = BertSelfAttention()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN, epsilon=1e-12), nn.LayerNorm(HIDDEN, epsilon=1e-12)
        self.intermediate, self.output = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)
        self.dropout = nn.Dropout(0.1)

    def forward(self, h, ext_mask):
        h = self.ln1(h + self.dropout(self.attention(h, ext_mask)))
        return self.ln2(h + self.dropout(self.output(F.gelu(self.intermediate(h)))))


class BertForSequenceClassification(nn.Layer):
    def __init__(self):
        super().__init__()
        self.embeddings = BertEmbeddings()
        self.encoder = nn.LayerList([BertLayer() for _ in range(LAYERS)])
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.classifier = nn.Linear(HIDDEN, LABELS)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None):
        if token_type_ids is None:
            token_type_ids = paddle.zeros_like(input_ids)
        ext_mask = (1.0 - attention_mask.astype("float32").unsqueeze([1, 2])) * -10000.0
        h = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder:
            h = layer(h, ext_mask)
        logits = self.classifier(paddle.tanh(self.pooler(h[:, 0])))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


def main():
    paddle.seed(42)
    np.random.seed(42)
    loader = paddle.io.DataLoader(FakeTokenizedDataset(BATCH_SIZE * 6), batch_size=BATCH_SIZE, shuffle=True,
                                  drop_last=True)
    model = BertForSequenceClassification()
    steps = EPOCHS * len(loader)
    sched = paddle.optimizer.lr.LinearWarmup(paddle.optimizer.lr.PolynomialDecay(3e-5, steps, 0.0), 1, 0.0, 3e-5)
    no_decay = [p.name for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n or "ln" in n]
    opt = paddle.optimizer.AdamW(sched, parameters=model.parameters(), weight_decay=0.01, epsilon=1e-8,
                                 apply_decay_param_fun=lambda name: name not in no_decay,
                                 grad_clip=nn.ClipGradByGlobalNorm(1.0))
    model.train()
    for epoch in range(EPOCHS):
        for step, batch in enumerate(loader):
            outputs = model(**batch)
            loss = outputs["loss"]
            loss.backward()
            opt.step()
            sched.step()
            opt.clear_grad()
            print(f"epoch {epoch} step {step} loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
