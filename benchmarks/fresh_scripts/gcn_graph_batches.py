# Graph classification with a GCN written on paddle.geometric message passing (send_u_recv), PyG-style mini-batches:
# several small graphs per batch concatenated along the node axis, edge_index offset per graph, a batch vector of
# graph ids for segment pooling. Graph sizes vary, so every batch has a different number of nodes and edges.
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

SEED = 7
NUM_GRAPHS = 384          # the data set
GRAPHS_PER_BATCH = 32
EPOCHS = 2
NODE_FEATS = 64
HIDDEN = 256
NUM_LAYERS = 4
NUM_CLASSES = 6
MIN_NODES, MAX_NODES = 12, 90
AVG_DEGREE = 6


def make_graph(rng):
    n = int(rng.integers(MIN_NODES, MAX_NODES + 1))
    m = n * AVG_DEGREE // 2
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    edges = np.concatenate([np.stack([src, dst]), np.stack([dst, src])], axis=1)  # undirected
    x = rng.standard_normal((n, NODE_FEATS)).astype("float32")
    return x, edges.astype("int64"), int(rng.integers(0, NUM_CLASSES))


def collate(graphs):
    """Concatenate graphs into one disconnected big graph (offset edge ids), plus a node->graph vector."""
    xs, edges, batch, ys, offset = [], [], [], [], 0
    for gid, (x, e, y) in enumerate(graphs):
        xs.append(x)
        edges.append(e + offset)
        batch.append(np.full(len(x), gid, "int64"))
        ys.append(y)
        offset += len(x)
    return (paddle.to_tensor(np.concatenate(xs)), paddle.to_tensor(np.concatenate(edges, axis=1)),
            paddle.to_tensor(np.concatenate(batch)), paddle.to_tensor(np.array(ys, "int64")))


class GCNConv(nn.Layer):
    """Kipf & Welling: H' = D^-1/2 (A + I) D^-1/2 H W, with the normalisation applied per edge."""

    def __init__(self, cin, cout):
        super().__init__()
        self.lin = nn.Linear(cin, cout, bias_attr=False)
        self.bias = self.create_parameter([cout], is_bias=True)

    def forward(self, x, edge_index):
        n = x.shape[0]
        loops = paddle.arange(n, dtype="int64")
        src = paddle.concat([edge_index[0], loops])
        dst = paddle.concat([edge_index[1], loops])
        deg = paddle.zeros([n], "float32").scatter_(dst, paddle.ones_like(dst, "float32"), overwrite=False)
        norm = paddle.rsqrt(deg)
        h = self.lin(x)
        msg = h * norm.unsqueeze(-1)
        out = paddle.geometric.send_u_recv(msg, src, dst, reduce_op="sum", out_size=n)
        return out * norm.unsqueeze(-1) + self.bias


class GCNClassifier(nn.Layer):
    def __init__(self):
        super().__init__()
        dims = [NODE_FEATS] + [HIDDEN] * NUM_LAYERS
        self.convs = nn.LayerList([GCNConv(a, b) for a, b in zip(dims[:-1], dims[1:])])
        self.norms = nn.LayerList([nn.BatchNorm1D(HIDDEN) for _ in range(NUM_LAYERS)])
        self.head = nn.Sequential(nn.Linear(2 * HIDDEN, HIDDEN), nn.ReLU(), nn.Dropout(0.5),
                                  nn.Linear(HIDDEN, NUM_CLASSES))

    def forward(self, x, edge_index, batch):
        for conv, bn in zip(self.convs, self.norms):
            x = F.relu(bn(conv(x, edge_index)))
        pooled = paddle.concat([paddle.geometric.segment_mean(x, batch), paddle.geometric.segment_max(x, batch)], -1)
        return self.head(pooled)


if __name__ == "__main__":
    paddle.seed(SEED)
    rng = np.random.default_rng(SEED)
    dataset = [make_graph(rng) for _ in range(NUM_GRAPHS)]
    model = GCNClassifier()
    opt = paddle.optimizer.Adam(learning_rate=paddle.optimizer.lr.ReduceOnPlateau(0.01, factor=0.5, patience=3),
                                parameters=model.parameters(), weight_decay=5e-4)
    for epoch in range(EPOCHS):
        order = rng.permutation(NUM_GRAPHS)
        total = 0.0
        for i in range(0, NUM_GRAPHS, GRAPHS_PER_BATCH):
            x, edge_index, batch, y = collate([dataset[j] for j in order[i:i + GRAPHS_PER_BATCH]])
            loss = F.cross_entropy(model(x, edge_index, batch), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            total += float(loss)
        opt._learning_rate.step(total)
        print(f"epoch {epoch} loss {total / (NUM_GRAPHS // GRAPHS_PER_BATCH):.4f}")
