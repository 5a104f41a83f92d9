# A GPT-2-medium-sized decoder (355M parameters: 24 layers, d=1024, 16 heads, vocab 50257) built from
# paddle.nn.TransformerEncoderLayer blocks with a causal mask, chosen by preset name (--model gpt2-medium) the way
# training repos pick a size; untied output projection, gradient clipping, small batch and sequence.
import argparse

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

PRESETS = {
    "gpt2": dict(n_layer=12, d_model=768, n_head=12),
    "gpt2-medium": dict(n_layer=24, d_model=1024, n_head=16),
    "gpt2-large": dict(n_layer=36, d_model=1280, n_head=20),
}

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=sorted(PRESETS), default="gpt2-medium")
parser.add_argument("--vocab", type=int, default=50257)
parser.add_argument("--block-size", type=int, default=64)
parser.add_argument("--micro-batch", type=int, default=2)
parser.add_argument("--max-steps", type=int, default=3)
parser.add_argument("--lr", type=float, default=3e-4)


class DecoderOnlyLM(nn.Layer):
    def __init__(self, vocab, block_size, n_layer, d_model, n_head):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = self.create_parameter([1, block_size, d_model], default_initializer=nn.initializer.Normal(0, 0.02))
        self.blocks = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0, activation="gelu",
                                       normalize_before=True), n_layer)
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias_attr=False)

    def forward(self, idx):
        t = idx.shape[1]
        causal = paddle.tensor.triu(paddle.full([t, t], float("-inf")), 1)
        h = self.blocks(self.embed(idx) + self.pos[:, :t], src_mask=causal)
        return self.lm_head(self.norm(h))


def main():
    args = parser.parse_args()
    paddle.seed(0)
    model = DecoderOnlyLM(args.vocab, args.block_size, **PRESETS[args.model])
    print(f"{args.model}: {sum(p.numel().item() for p in model.parameters()) / 1e6:.1f}M parameters")
    opt = paddle.optimizer.AdamW(args.lr, parameters=model.parameters(), weight_decay=0.01,
                                 grad_clip=nn.ClipGradByGlobalNorm(1.0))
    data = paddle.randint(0, args.vocab, [64, args.block_size + 1], dtype="int64")
    for step in range(args.max_steps):
        chunk = data[step * args.micro_batch:(step + 1) * args.micro_batch]
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = model(x)
        loss = F.cross_entropy(logits.reshape([-1, args.vocab]), y.reshape([-1]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        print(f"step {step} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
