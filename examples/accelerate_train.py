"""Train a torchvision classifier with Hugging Face Accelerate on fastloader's loaders (docs/accelerate.md):

    .venv/bin/python examples/accelerate_train.py configs/sample.yaml --epochs 2 --state run/state
    .venv/bin/accelerate launch --num_processes 2 examples/accelerate_train.py configs/sample.yaml --state run/state

The model and the optimizer go through accelerator.prepare; the loader does not (Accelerate's
prepare takes torch DataLoaders; fastloader puts each rank's batches on its device and shards for
torch.distributed itself). accelerator.register_for_checkpointing(loader) puts the loader's position
in every save_state, so starting again with the same --state resumes mid-epoch with exactly the
batches not yet trained on, instead of skipping batches (Accelerate's skip_first_batches, which
would replay another epoch's order here).
"""
from __future__ import annotations

import fastloader  # noqa: F401  first, so DALI binds nvidia-nvjpeg's nvJPEG, not torchvision's (docs/install.md)

# isort: split
import argparse
import logging
import os
import sys

import torch
import torchvision
from accelerate import Accelerator

from fastloader import build_loader
from fastloader.errors import ConfigError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--state", default="accelerate_state", help="save_state's folder, resumed from when present")
    parser.add_argument("--save-every", type=int, default=50, metavar="STEPS")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps, saving the state")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    accelerator = Accelerator()
    try:  # on each rank its own device: the one Accelerate chose
        loader = build_loader(args.config, "train", overrides=[*args.overrides, f"output.device={accelerator.device}"])
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    model = torchvision.models.get_model(args.model, num_classes=loader.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(loader)
    if os.path.isdir(args.state):
        accelerator.load_state(args.state)  # the model, the optimizer and the loader's position
        accelerator.print(f"resumed from {args.state}: epoch {loader.next_epoch}, sample {loader.resume_position}")
    step = 0
    while loader.next_epoch < args.epochs:
        epoch = loader.next_epoch
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % args.save_every == 0 or step == args.max_steps:
                accelerator.save_state(args.state)
            if step == args.max_steps:
                accelerator.print(f"stopped after {step} steps; the same command resumes")
                return 0
        accelerator.print(f"epoch {epoch} done: loss {loss.item():.4f}")
    accelerator.save_state(args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
