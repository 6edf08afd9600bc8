"""Train a torchvision classifier with PyTorch Lightning on fastloader's loaders (docs/lightning.md):

    .venv/bin/python examples/lightning_train.py configs/sample.yaml --epochs 2
    .venv/bin/python examples/lightning_train.py configs/sample.yaml --epochs 2 --resume last   # after a stop

fastloader.lightning.DataModule builds the config's train and val loaders on each rank in setup();
the Trainer's ModelCheckpoint saves the train loader's position with the model every --save-every
steps, and --resume continues mid-epoch with exactly the batches not yet trained on. Under DDP
(`--devices 2 --strategy ddp`) each rank reads its own share: fastloader shards for
torch.distributed, Lightning's sampler injection does not touch it.
"""
from __future__ import annotations

import fastloader  # noqa: F401  first, so DALI binds nvidia-nvjpeg's nvJPEG, not torchvision's (docs/install.md)

# isort: split
import argparse
import logging
import sys

import lightning.pytorch as pl
import torch
import torchvision
from lightning.pytorch.callbacks import ModelCheckpoint

from fastloader.errors import ConfigError
from fastloader.lightning import DataModule


class Classifier(pl.LightningModule):
    def __init__(self, model: str, num_classes: int, lr: float):
        super().__init__()
        self.net = torchvision.models.get_model(model, num_classes=num_classes)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        images, labels = batch  # on the loader's device already; labels int64 or soft targets
        loss = torch.nn.functional.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val_accuracy", (self.net(images).argmax(1) == labels).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--save-every", type=int, default=50, metavar="STEPS")
    parser.add_argument("--checkpoints", default="lightning_checkpoints")
    parser.add_argument("--resume", metavar="CKPT", help="a checkpoint path, or `last`")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        data = DataModule(args.config, overrides=args.overrides)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    model = Classifier(args.model, len(data.classes), args.lr)
    saving = ModelCheckpoint(dirpath=args.checkpoints, every_n_train_steps=args.save_every, save_last=True)
    trainer = pl.Trainer(max_epochs=args.epochs, max_steps=args.max_steps, devices=args.devices,
                         strategy=args.strategy, callbacks=[saving], logger=False, default_root_dir=args.checkpoints)
    trainer.fit(model, datamodule=data, ckpt_path=args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
