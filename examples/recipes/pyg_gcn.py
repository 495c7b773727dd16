"""PyTorch Geometric: a graph classifier on PyG's DataLoader, measured by PerfCallback (a batch counts its graphs).

Run: python examples/recipes/pyg_gcn.py [--root DIR]
"""

import argparse

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv, global_mean_pool

from lightning_perf import PerfCallback

parser = argparse.ArgumentParser()
parser.add_argument("--root", default="pyg_logs")
root = parser.parse_args().root


class GCN(LightningModule):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2, self.head = GCNConv(16, 64), GCNConv(64, 64), torch.nn.Linear(64, 2)

    def training_step(self, batch, batch_idx):
        h = F.relu(self.conv2(F.relu(self.conv1(batch.x, batch.edge_index)), batch.edge_index))
        loss = F.cross_entropy(self.head(global_mean_pool(h, batch.batch)), batch.y)
        self.log("train_loss", loss, batch_size=batch.num_graphs)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


# 160 random graphs of 10-30 nodes, labelled by the sign of their first feature's mean.
g = torch.Generator().manual_seed(0)
graphs = []
for _ in range(160):
    n = int(torch.randint(10, 31, (1,), generator=g))
    x = torch.randn(n, 16, generator=g)
    graphs.append(
        Data(x=x, edge_index=torch.randint(0, n, (2, 3 * n), generator=g), y=torch.tensor([int(x[:, 0].mean() > 0)]))
    )

# --8<-- [start:recipe]
# A graph-level task: each batch counts its graphs (batch.num_graphs), with nothing to pass.
# For node-level tasks on one large graph, count the seed nodes of a NeighborLoader's batch:
# PerfCallback(batch_size_fn=lambda batch: int(batch.batch_size)).
trainer = Trainer(max_epochs=2, default_root_dir=root, callbacks=[PerfCallback()], enable_progress_bar=False)
trainer.fit(GCN(), DataLoader(graphs, batch_size=16, shuffle=True))
# --8<-- [end:recipe]

print("report:", trainer.callbacks[0].report_path if isinstance(trainer.callbacks[0], PerfCallback) else None)
