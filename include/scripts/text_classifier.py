"""A small Transformer text classifier (paddle.nn.TransformerEncoder) retrained each night, resuming from
the previous night's checkpoint.

Data: include/data/text/topics.tsv (synthetic sentences on four topics, CC0; see its README). Each run
trains ``--epochs`` more epochs and saves ``last.pdparams``/``last.pdopt``/``last.json`` in the output
folder autodl gives in AUTODL_OUTPUT_DIR (the spec's ``task.output_dir``, else
``$AUTODL_HOME/outputs/<model_name>``); when a checkpoint is there, training resumes from it. The
vocabulary is kept beside the checkpoint, so a resumed model reads words the way it learned them.

autodl's environment contract: AUTODL_PADDLE_DEVICE (``cpu`` on a declared pool),
AUTODL_BATCH_SIZE_PER_GPU (the spec's batch), AUTODL_METRICS_FILE (one JSON line per step) and
AUTODL_REPORT_FILE (what this run resumed from and saved; autodl keeps it in the run record).
"""

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

BATCH_SIZE = 64
VOCAB_SIZE = 1024      # token ids 0..1023: 0 padding, 1 unknown word, then the most frequent training words
MAX_LEN = 24
D_MODEL = 64
N_HEAD = 4
N_LAYERS = 2
DIM_FF = 128
LABELS = ["weather", "sports", "food", "technology"]
PAD, UNK = 0, 1
DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "text" / "topics.tsv"


class TextClassifier(nn.Layer):
    """Token and position embeddings, a TransformerEncoder, mean pooling over real tokens, a linear head."""

    def __init__(self, vocab_size: int = VOCAB_SIZE, num_classes: int = len(LABELS)):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, D_MODEL)
        self.position = nn.Embedding(MAX_LEN, D_MODEL)
        layer = nn.TransformerEncoderLayer(d_model=D_MODEL, nhead=N_HEAD, dim_feedforward=DIM_FF, dropout=0.1)
        self.encoder = nn.TransformerEncoder(layer, num_layers=N_LAYERS)
        self.head = nn.Linear(D_MODEL, num_classes)

    def forward(self, tokens):
        positions = paddle.arange(tokens.shape[1]).unsqueeze(0)
        x = self.embed(tokens) + self.position(positions)
        keep = (tokens != PAD).astype("float32")                      # [batch, seq]
        # attention mask: 0 where a key is a real token, -1e9 where it is padding
        mask = ((1.0 - keep) * -1e9).unsqueeze(1).unsqueeze(1)       # [batch, 1, 1, seq]
        x = self.encoder(x, src_mask=mask)
        pooled = (x * keep.unsqueeze(-1)).sum(axis=1) / keep.sum(axis=1, keepdim=True).clip(min=1.0)
        return self.head(pooled)


def read_rows(path: Path) -> list[tuple[str, str, str]]:
    lines = path.read_text().splitlines()[1:]
    cells = (line.split("\t", 2) for line in lines if line.strip())
    return [(split, label, text) for split, label, text in cells]


def build_vocab(sentences: list[str]) -> dict[str, int]:
    """The VOCAB_SIZE - 2 most frequent words (ties in alphabetical order) -> ids from 2."""
    counts: dict[str, int] = {}
    for s in sentences:
        for w in s.split():
            counts[w] = counts.get(w, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))[: VOCAB_SIZE - 2]
    return {w: i + 2 for i, w in enumerate(words)}


def encode(sentences: list[str], vocab: dict[str, int]) -> np.ndarray:
    out = np.full((len(sentences), MAX_LEN), PAD, dtype="int64")
    for i, s in enumerate(sentences):
        ids = [vocab.get(w, UNK) for w in s.split()][:MAX_LEN]
        out[i, : len(ids)] = ids
    return out


def report_step(step: int, samples: int) -> None:
    """Append one step to $AUTODL_METRICS_FILE (set by autodl's launcher) so step time is measured."""
    path = os.environ.get("AUTODL_METRICS_FILE")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"step": step, "samples": samples, "t": time.time()}) + "\n")


def save_atomically(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    paddle.save(obj, str(tmp))
    os.replace(tmp, path)


def evaluate(model, tokens: np.ndarray, labels: np.ndarray, batch_size: int) -> float:
    model.eval()
    correct = 0
    with paddle.no_grad():
        for i in range(0, len(tokens), batch_size):
            logits = model(paddle.to_tensor(tokens[i:i + batch_size]))
            correct += int((logits.argmax(axis=1).numpy() == labels[i:i + batch_size]).sum())
    model.train()
    return correct / max(1, len(tokens))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train in this run (on top of the checkpoint)")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--output-dir", default=os.environ.get("AUTODL_OUTPUT_DIR", "outputs/text_classifier"))
    parser.add_argument("--max-train", type=int, default=0, help="use at most this many training sentences (0: all)")
    # the spec's task.batch_size_per_gpu reaches the script as AUTODL_BATCH_SIZE_PER_GPU
    parser.add_argument("--batch-size", type=int, default=int(os.environ.get("AUTODL_BATCH_SIZE_PER_GPU", BATCH_SIZE)))
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    paddle.set_device(os.environ.get("AUTODL_PADDLE_DEVICE", "cpu"))
    paddle.seed(0)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(Path(args.data))
    train = [(label, text) for split, label, text in rows if split == "train"]
    val = [(label, text) for split, label, text in rows if split == "val"]
    if args.max_train:
        train = train[: args.max_train]

    meta_path, vocab_path = out / "last.json", out / "vocab.json"
    resumed = json.loads(meta_path.read_text()) if meta_path.exists() else None
    if resumed and vocab_path.exists():
        vocab = json.loads(vocab_path.read_text())
    else:
        vocab = build_vocab([text for _label, text in train])
        vocab_path.write_text(json.dumps(vocab))
    model = TextClassifier()
    opt = paddle.optimizer.AdamW(learning_rate=args.lr, parameters=model.parameters())
    start_epoch = 0
    if resumed:
        model.set_state_dict(paddle.load(str(out / "last.pdparams")))
        opt.set_state_dict(paddle.load(str(out / "last.pdopt")))
        start_epoch = int(resumed["epoch"])
        print(f"resuming from {out / 'last.pdparams'} after epoch {start_epoch} "
              f"(val accuracy {resumed.get('val_accuracy')})", flush=True)
    else:
        print(f"no checkpoint in {out}: training from scratch", flush=True)

    x_train = encode([t for _l, t in train], vocab)
    y_train = np.array([LABELS.index(label) for label, _t in train], dtype="int64")
    x_val = encode([t for _l, t in val], vocab)
    y_val = np.array([LABELS.index(label) for label, _t in val], dtype="int64")
    rng = np.random.default_rng(start_epoch)
    began = time.time()
    step = 0
    for epoch in range(start_epoch, start_epoch + args.epochs):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - args.batch_size + 1, args.batch_size):
            idx = order[i:i + args.batch_size]
            loss = F.cross_entropy(model(paddle.to_tensor(x_train[idx])), paddle.to_tensor(y_train[idx]))
            loss.backward()
            opt.step()
            opt.clear_grad()
            report_step(step, len(idx))
            if step % 10 == 0:
                print(f"epoch {epoch + 1} step {step} loss {float(loss):.4f}", flush=True)
            step += 1
        accuracy = evaluate(model, x_val, y_val, args.batch_size)
        print(f"epoch {epoch + 1}: val accuracy {accuracy:.3f}", flush=True)
        save_atomically(model.state_dict(), out / "last.pdparams")
        save_atomically(opt.state_dict(), out / "last.pdopt")
        meta = {"epoch": epoch + 1, "val_accuracy": round(accuracy, 4), "saved_at": time.time(),
                "run_key": os.environ.get("AUTODL_RUN_KEY")}
        meta_path.write_text(json.dumps(meta))
        with open(out / "history.jsonl", "a") as fh:
            fh.write(json.dumps(meta) + "\n")

    end_epoch = start_epoch + args.epochs
    report = {
        "checkpoint_dir": str(out.resolve()),
        "resumed_from": str((out / "last.pdparams").resolve()) if resumed else None,
        "resumed_epoch": start_epoch if resumed else None,
        "epochs_trained": args.epochs,
        "epoch": end_epoch,
        "val_accuracy": round(accuracy, 4) if args.epochs else (resumed or {}).get("val_accuracy"),
        "checkpoint": str((out / "last.pdparams").resolve()),
    }
    report_path = os.environ.get("AUTODL_REPORT_FILE")
    if report_path:
        Path(report_path).write_text(json.dumps(report, indent=2))
    print(f"done: epochs {start_epoch + 1}..{end_epoch} in {time.time() - began:.2f} s on {paddle.get_device()}",
          flush=True)


if __name__ == "__main__":
    main()
