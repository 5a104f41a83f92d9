# GAT with a dense block-diagonal adjacency per mini-batch (the graphs of a batch stacked along the node axis), masked
# softmax attention over neighbours, residual heads, multi-label BCE loss. Hyper-parameters from configs/gat_ppi.yaml.
import os

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import yaml

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "gat_ppi.yaml")) as f:
    CFG = yaml.safe_load(f)


class PPILike(paddle.io.Dataset):
    def __init__(self, cfg, seed):
        rng = np.random.default_rng(seed)
        self.graphs = []
        for _ in range(cfg["num_graphs"]):
            n = int(rng.integers(cfg["min_nodes"], cfg["max_nodes"] + 1))
            adj = rng.random((n, n)) < cfg["edge_prob"]
            adj = np.logical_or(adj, adj.T)
            x = rng.standard_normal((n, cfg["in_features"])).astype("float32")
            y = (rng.random((n, cfg["num_labels"])) < 0.1).astype("float32")
            self.graphs.append((x, adj, y))

    def __len__(self):
        return len(self.graphs)

    def __getitem__(self, i):
        return self.graphs[i]


def block_diag_collate(items):
    n = sum(len(x) for x, _, _ in items)
    adj = np.zeros((n, n), "bool")
    o = 0
    for x, a, _ in items:
        adj[o:o + len(x), o:o + len(x)] = a
        o += len(x)
    np.fill_diagonal(adj, True)
    x = np.concatenate([it[0] for it in items])
    y = np.concatenate([it[2] for it in items])
    return paddle.to_tensor(x), paddle.to_tensor(adj), paddle.to_tensor(y)


class GATLayer(nn.Layer):
    def __init__(self, cin, cout, heads, concat, slope, dropout):
        super().__init__()
        self.heads, self.cout, self.concat, self.slope = heads, cout, concat, slope
        self.W = nn.Linear(cin, heads * cout, bias_attr=False)
        self.a_src = self.create_parameter([heads, cout], default_initializer=nn.initializer.XavierUniform())
        self.a_dst = self.create_parameter([heads, cout], default_initializer=nn.initializer.XavierUniform())
        self.res = nn.Linear(cin, heads * cout if concat else cout, bias_attr=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, adj):
        n = x.shape[0]
        h = self.W(x).reshape([n, self.heads, self.cout])
        e_src = (h * self.a_src).sum(-1)                       # [N, H]
        e_dst = (h * self.a_dst).sum(-1)
        e = F.leaky_relu(e_dst.T.unsqueeze(-1) + e_src.T.unsqueeze(1), self.slope)  # [H, N(dst), N(src)]
        e = paddle.where(adj.unsqueeze(0), e, paddle.full_like(e, -1e9))
        att = self.drop(F.softmax(e, axis=-1))
        out = paddle.matmul(att, h.transpose([1, 0, 2]))       # [H, N, C]
        out = out.transpose([1, 0, 2])
        out = out.reshape([n, self.heads * self.cout]) if self.concat else out.mean(1)
        return out + self.res(x)


class GAT(nn.Layer):
    def __init__(self, data, m):
        super().__init__()
        heads, hid = m["heads"], m["hidden_per_head"]
        self.l1 = GATLayer(data["in_features"], hid, heads[0], True, m["negative_slope"], m["dropout"])
        self.l2 = GATLayer(hid * heads[0], hid, heads[1], True, m["negative_slope"], m["dropout"])
        self.l3 = GATLayer(hid * heads[1], data["num_labels"], heads[2], False, m["negative_slope"], m["dropout"])

    def forward(self, x, adj):
        x = F.elu(self.l1(x, adj))
        x = F.elu(self.l2(x, adj))
        return self.l3(x, adj)


def run():
    paddle.seed(CFG["seed"])
    np.random.seed(CFG["seed"])  # DataLoader(shuffle=True) draws its order from NumPy's global generator
    data = PPILike(CFG["data"], CFG["seed"])
    loader = paddle.io.DataLoader(data, batch_size=CFG["data"]["graphs_per_batch"], shuffle=True,
                                  collate_fn=block_diag_collate)
    model = GAT(CFG["data"], CFG["model"])
    opt = paddle.optimizer.Adam(CFG["train"]["lr"], parameters=model.parameters())
    for epoch in range(CFG["train"]["epochs"]):
        for it, (x, adj, y) in enumerate(loader):
            logits = model(x, adj)
            loss = F.binary_cross_entropy_with_logits(logits, y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            print(f"epoch {epoch} it {it} nodes {x.shape[0]} loss {float(loss):.4f}")


if __name__ == "__main__":
    run()
