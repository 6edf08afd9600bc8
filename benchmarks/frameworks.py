"""What a training framework costs fastloader's loader: the same train split and the same tiny model
step (a linear layer on the images' mean colour, SGD) in a bare `for` loop, in PyTorch Lightning's
fit loop (fastloader.lightning.DataModule) and in a Hugging Face Accelerate loop, in one run.

Per round, each framework gets a fresh loader, one untimed epoch, then --epochs timed ones:
images/s of the timed epochs. The issue's bar: Lightning >= 0.97x the bare loop.

    python benchmarks/frameworks.py --data ../shared/data/realphotos [--rounds 3] [--epochs 2]
"""
from __future__ import annotations

import json
import logging
import statistics
import time

import harness
import torch

from fastloader import build_loader
from fastloader.config_dump import config_to_raw
from fastloader.parallel import available_cores

FRAMEWORKS = ("bare loop", "Lightning", "Accelerate")


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
         backward=None) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(model(images.float().mean(dim=(2, 3))), labels)
    (backward or torch.Tensor.backward)(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss


def bare(config: dict, epochs: int, classes: int) -> float:
    model = torch.nn.Linear(3, classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with build_loader(config, "train") as loader:
        for images, labels in loader:
            step(model, optimizer, images, labels)
        started, samples = time.perf_counter(), 0
        for _ in range(epochs):
            for images, labels in loader:
                step(model, optimizer, images, labels)
                samples += len(labels)
    return samples / (time.perf_counter() - started)


def lightning(config: dict, epochs: int, classes: int) -> float:
    import lightning.pytorch as pl

    from fastloader.lightning import DataModule
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # its start-up lines, not the figures

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer, self.samples, self.started = torch.nn.Linear(3, classes), 0, None

        def training_step(self, batch, batch_idx):
            images, labels = batch
            if self.current_epoch > 0:
                self.samples += len(labels)
            return torch.nn.functional.cross_entropy(self.layer(images.float().mean(dim=(2, 3))), labels)

        def on_train_epoch_start(self):
            if self.current_epoch == 1:
                self.started = time.perf_counter()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Tiny()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1 + epochs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=DataModule(config, val_split=None))
    return model.samples / (time.perf_counter() - model.started)


def accelerate(config: dict, epochs: int, classes: int) -> float:
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    with build_loader(config, "train") as loader:
        accelerator.register_for_checkpointing(loader)
        for images, labels in loader:
            step(model, optimizer, images, labels, accelerator.backward)
        started, samples = time.perf_counter(), 0
        for _ in range(epochs):
            for images, labels in loader:
                step(model, optimizer, images, labels, accelerator.backward)
                samples += len(labels)
    return samples / (time.perf_counter() - started)


def main() -> None:
    parser = harness.epochs_parser(__doc__)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    config = config_to_raw(harness.fastloader.load_config(harness.CONFIG, {"dataset.root": str(data)}))
    config.update(backend="torch", output={**config["output"], "device": "cpu"},
                  workers={**config["workers"], "num_workers": args.workers})
    config["train"] = {**config["train"], "batch_size": args.batch_size,
                       "transform": {**config["train"]["transform"], "size": args.size}}
    with build_loader(config, "train") as probe:
        classes, samples = probe.num_classes, len(probe) * args.batch_size
    print(f"data: {data}; {available_cores()} cores; batch {args.batch_size}, {args.size} px; {args.workers} workers; "
          f"{args.rounds} rounds; images/s over {args.epochs} epochs of {samples} images after one untimed", flush=True)
    runs = {name: [] for name in FRAMEWORKS}
    for _ in range(args.rounds):
        for name, run in zip(FRAMEWORKS, (bare, lightning, accelerate)):  # interleaved: the drift falls on all
            runs[name].append(run(config, args.epochs, classes))
    rate = {name: statistics.median(values) for name, values in runs.items()}
    print(f"  {'framework':<12} {'images/s':>9} {'x bare loop':>12}")
    for name in FRAMEWORKS:
        print(f"  {name:<12} {rate[name]:>9.0f} {rate[name] / rate['bare loop']:>11.2f}x")
    print(f"  Lightning / bare loop (bar >= 0.97x): {rate['Lightning'] / rate['bare loop']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
