"""Named-entity tagger: 3-layer bidirectional LSTM over word embeddings, on padded variable-length sentences.

Token ids (int64) and true lengths come from a Dataset; the LSTM gets sequence_length so padding is skipped;
the token loss is masked by length.  Adam with gradient clipping by value and an inverse-time decay.
"""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset

VOCAB = 30000
TAGS = 9          # BIO tags of CoNLL-2003
MAX_LEN = 64
EMB = 300
HIDDEN = 384
LAYERS = 3
BATCH = 32


class Sentences(Dataset):
    def __init__(self, n=192):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        length = np.random.randint(8, MAX_LEN + 1)
        words = np.zeros(MAX_LEN, dtype="int64")
        tags = np.zeros(MAX_LEN, dtype="int64")
        words[:length] = np.random.randint(2, VOCAB, length)
        tags[:length] = np.random.randint(0, TAGS, length)
        return words, tags, np.int64(length)


class BiLSTMTagger(nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMB, padding_idx=0)
        self.lstm = nn.LSTM(EMB, HIDDEN, num_layers=LAYERS, direction="bidirectional", dropout=0.33)
        self.drop = nn.Dropout(0.33)
        self.proj = nn.Linear(2 * HIDDEN, TAGS)

    def forward(self, words, lengths):
        x = self.drop(self.embed(words))
        out, _ = self.lstm(x, sequence_length=lengths)
        return self.proj(self.drop(out))


def masked_token_loss(logits, tags, lengths):
    mask = paddle.arange(logits.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)    # [B, T] bool
    per_tok = F.cross_entropy(logits, tags.unsqueeze(-1), reduction="none").squeeze(-1)
    per_tok = paddle.where(mask, per_tok, paddle.zeros_like(per_tok))
    return per_tok.sum() / mask.astype("float32").sum()


if __name__ == "__main__":
    tagger = BiLSTMTagger()
    lr = paddle.optimizer.lr.InverseTimeDecay(learning_rate=1e-3, gamma=0.05)
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=tagger.parameters(),
                                grad_clip=nn.ClipGradByValue(max=5.0))
    loader = DataLoader(Sentences(), batch_size=BATCH, shuffle=True)
    for epoch in range(1):
        for step, (words, tags, lengths) in enumerate(loader):
            logits = tagger(words, lengths)
            loss = masked_token_loss(logits, tags, lengths)
            loss.backward()
            opt.step()
            opt.clear_grad()
            print(f"step {step} loss {loss.item():.4f}")
        lr.step()
