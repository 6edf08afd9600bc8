"""timm's train.py loop on fastloader: timm's dataset, model, mixup, loss and its --mixup-off-epoch, with
`from fastloader.timm import create_loader` where train.py imports timm's (docs/timm.md):

    .venv/bin/python examples/timm_train.py DATA --model resnet18 --epochs 2 --aa rand-m9-mstd0.5-inc1 --mixup 0.8

DATA is a folder with train/ and val/ folders of class folders. The loaders take timm's
create_loader arguments by their names; what fastloader does not do is refused by name.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import timm
import torch
from timm.data import create_dataset
from timm.data.mixup import FastCollateMixup
from timm.loss import SoftTargetCrossEntropy

from fastloader.errors import ConfigError
from fastloader.timm import create_loader


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--aa", default=None)
    parser.add_argument("--reprob", type=float, default=0.0)
    parser.add_argument("--mixup", type=float, default=0.0)
    parser.add_argument("--smoothing", type=float, default=0.1)
    parser.add_argument("--mixup-off-epoch", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=0, help="steps per epoch at most (a quick look)")
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set = create_dataset("", root=os.path.join(args.data, "train"))
    val_set = create_dataset("", root=os.path.join(args.data, "val"))
    classes = len(train_set.reader.class_to_idx)
    mixup = FastCollateMixup(mixup_alpha=args.mixup, label_smoothing=args.smoothing, num_classes=classes)
    common = {"input_size": (3, args.img_size, args.img_size), "batch_size": args.batch_size,
              "num_workers": args.workers, "device": device, "overrides": {"backend": args.backend}}
    try:
        loader_train = create_loader(train_set, is_training=True, auto_augment=args.aa, re_prob=args.reprob,
                                     collate_fn=mixup, **common)
        loader_eval = create_loader(val_set, **common)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    model = timm.create_model(args.model, num_classes=classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = SoftTargetCrossEntropy()  # the loader gives soft targets (FastCollateMixup's smoothing and mixing)
    for epoch in range(args.epochs):
        loader_train.sampler.set_epoch(epoch)
        if args.mixup_off_epoch and epoch >= args.mixup_off_epoch and loader_train.mixup_enabled:
            loader_train.mixup_enabled = False
        model.train()
        for step, (images, targets) in enumerate(loader_train):
            loss = loss_fn(model(images), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.max_steps and step + 1 >= args.max_steps:
                break
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in loader_eval)
        print(f"epoch {epoch}: loss {loss.item():.4f}, mixing {'on' if loader_train.mixup_enabled else 'off'}, "
              f"val accuracy {correct / loader_eval.num_samples:.3f} on {loader_eval.num_samples} images", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
