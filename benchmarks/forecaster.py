"""
A forecaster of the TemporalFusionTransformer's shape
=====================================================

A real multi-module model for the cost benchmarks (``benchmarks/profiling_budget.py``), built here so that
nothing but torch and Lightning is needed: the shape of pytorch-forecasting's ``TemporalFusionTransformer``
(Lim et al., 2021), whose windows issue 26 measured at 0.29-0.51 s each on this machine. Dozens of small
modules, many small operators per step:

- a variable selection network per part (encoder: 8 variables, decoder: 4), each a gated residual network
  (GRN: two linear layers, ELU, a GLU gate, a residual and a layer norm) per variable plus one for the
  weights;
- an LSTM encoder and an LSTM decoder, a gated skip over them;
- multi-head self-attention over the whole sequence (causal), a GRN after it;
- a quantile head (7 quantiles) on the decoder's steps, trained with the quantile (pinball) loss.

The data are random tensors in memory (``TensorDataset``): past and future inputs, and targets.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)


class GatedResidual(nn.Module):
    """A gated residual network: ``LayerNorm(skip(x) + GLU(W2 ELU(W1 x)))``."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int) -> None:
        super().__init__()
        self.skip = nn.Linear(d_in, d_out) if d_in != d_out else nn.Identity()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.gate = nn.Linear(d_hidden, 2 * d_out)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(F.elu(self.fc1(x)))
        return self.norm(self.skip(x) + F.glu(self.gate(h), dim=-1))


class VariableSelection(nn.Module):
    """A GRN per input variable, weighted by a softmax a GRN over all of them computes."""

    def __init__(self, variables: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.ModuleList(nn.Linear(1, hidden) for _ in range(variables))
        self.per_variable = nn.ModuleList(GatedResidual(hidden, hidden, hidden) for _ in range(variables))
        self.weights = GatedResidual(variables * hidden, hidden, variables)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, time, variables) -> (batch, time, hidden)
        embedded = [embed(x[..., i : i + 1]) for i, embed in enumerate(self.embed)]
        weights = torch.softmax(self.weights(torch.cat(embedded, dim=-1)), dim=-1)
        transformed = torch.stack([grn(e) for grn, e in zip(self.per_variable, embedded, strict=True)], dim=-1)
        return (transformed * weights.unsqueeze(-2)).sum(-1)


class Forecaster(pl.LightningModule):
    """Encoder ``past`` steps of ``past_vars`` variables, decoder ``future`` steps of ``future_vars``."""

    def __init__(self, past_vars: int = 8, future_vars: int = 4, hidden: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.encoder_vars = VariableSelection(past_vars, hidden)
        self.decoder_vars = VariableSelection(future_vars, hidden)
        self.encoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.decoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.lstm_gate = GatedResidual(hidden, hidden, hidden)
        self.attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.attention_gate = GatedResidual(hidden, hidden, hidden)
        self.position_wise = GatedResidual(hidden, hidden, hidden)
        self.head = nn.Linear(hidden, len(QUANTILES))

    def forward(self, past: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
        enc_in, dec_in = self.encoder_vars(past), self.decoder_vars(future)
        enc_out, state = self.encoder(enc_in)
        dec_out, _ = self.decoder(dec_in, state)
        lstm = self.lstm_gate(torch.cat([enc_out, dec_out], dim=1) + torch.cat([enc_in, dec_in], dim=1))
        steps = lstm.shape[1]
        causal = torch.triu(torch.ones(steps, steps, dtype=torch.bool, device=lstm.device), diagonal=1)
        attended, _ = self.attention(lstm, lstm, lstm, attn_mask=causal, need_weights=False)
        out = self.position_wise(self.attention_gate(attended + lstm))
        return self.head(out[:, -future.shape[1] :])

    def _loss(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        past, future, target = batch
        predicted = self(past, future)
        q = torch.tensor(QUANTILES, device=predicted.device)
        error = target.unsqueeze(-1) - predicted
        return torch.max(q * error, (q - 1) * error).mean()

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def loaders(
    train_batches: int = 30, val_batches: int = 10, batch_size: int = 64, past: int = 24, future: int = 6
) -> tuple[DataLoader, DataLoader]:
    """Random in-memory series: ``train_batches`` and ``val_batches`` batches of ``batch_size``."""
    generator = torch.Generator().manual_seed(0)

    def data(batches: int) -> TensorDataset:
        n = batches * batch_size
        return TensorDataset(
            torch.randn(n, past, 8, generator=generator),
            torch.randn(n, future, 4, generator=generator),
            torch.randn(n, future, generator=generator),
        )

    return (
        DataLoader(data(train_batches), batch_size=batch_size, shuffle=True, generator=generator),
        DataLoader(data(val_batches), batch_size=batch_size),
    )
