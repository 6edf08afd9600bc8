"""A Lightning run over fastloader.lightning.DataModule, as a user's script: a tiny model records the
identity of every image it trains on (tests/test_lightning.py runs it in-process and under DDP)."""
from __future__ import annotations

import json
import sys

import lightning.pytorch as pl
import torch
from conftest import identities

from fastloader.lightning import DataModule


class Recorder(pl.LightningModule):
    """A linear model that notes, per training step, the colours of its batch's images."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 3)
        self.seen: list[list[tuple]] = []

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.seen.append(identities(images))
        return torch.nn.functional.cross_entropy(self.layer(images.mean(dim=(2, 3))), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(images.mean(dim=(2, 3))), labels))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(root: str, **options) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=root, **options)


def datamodule(config: dict) -> DataModule:
    return DataModule(config)


if __name__ == "__main__":  # python lightning_run.py CONFIG_JSON OUT_JSON: 2 DDP ranks, 1 epoch
    config, out = json.loads(sys.argv[1]), sys.argv[2]
    model = Recorder()
    run = trainer(config["dataset"]["root"], devices=2, strategy="ddp", max_epochs=1, num_sanity_val_steps=0)
    run.fit(model, datamodule=datamodule(config))
    with open(f"{out}.{run.global_rank}", "w") as handle:
        json.dump({"seen": model.seen, "world_size": run.world_size}, handle)
