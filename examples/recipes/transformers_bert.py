"""Hugging Face transformers: a small BERT classifier inside a LightningModule, measured by PerfCallback, counting
tokens instead of sequences.

Run: python examples/recipes/transformers_bert.py [--root DIR]
"""

import argparse

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader
from transformers import BatchEncoding, BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

from lightning_perf import PerfCallback

parser = argparse.ArgumentParser()
parser.add_argument("--root", default="transformers_logs")
root = parser.parse_args().root


# --8<-- [start:module]
class Classifier(LightningModule):
    def __init__(self):
        super().__init__()
        config = BertConfig(
            vocab_size=1000,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            num_labels=2,
        )
        self.model = BertForSequenceClassification(config)  # from a config: nothing to download

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss  # batch: a tokenizer's BatchEncoding (a dict works alike)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=4, num_training_steps=100)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


# --8<-- [end:module]


# Token ids as a tokenizer would make them: 240 sequences of 8-32 tokens, padded to 32.
g = torch.Generator().manual_seed(0)
ids = torch.randint(1, 1000, (240, 32), generator=g)
mask = (torch.arange(32) < torch.randint(8, 33, (240, 1), generator=g)).long()
rows = list(zip(ids * mask, mask, ids[:, 0] % 2, strict=True))


def collate(batch):
    input_ids, attention_mask, labels = (torch.stack(column) for column in zip(*batch, strict=True))
    return BatchEncoding({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})


loader = DataLoader(rows, batch_size=16, shuffle=True, collate_fn=collate)

# --8<-- [start:recipe]
# Throughput and FLOPs per sample count tokens: the attention mask's ones, not the 16 sequences.
callback = PerfCallback(batch_size_fn=lambda batch: int(batch["attention_mask"].sum()))
trainer = Trainer(max_epochs=2, default_root_dir=root, callbacks=[callback], enable_progress_bar=False)
trainer.fit(Classifier(), loader)
# --8<-- [end:recipe]

print("report:", callback.report_path)
