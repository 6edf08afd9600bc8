"""A DINO-style self-distillation loop on fastloader's views (train.views, docs/views.md): a student
sees every view of each image, an EMA teacher the global ones, and the student learns to match the
teacher's centred, sharpened output on the other views (Caron et al. 2021; DINOv2's recipe in
configs/recipes/dinov2.yaml). Runs on the embedded demo by default, no download:

    .venv/bin/python examples/views.py --quick
    .venv/bin/python examples/views.py --steps 20
    .venv/bin/python examples/views.py configs/recipes/dinov2.yaml --set dataset.root=/data/imagenet

On a CPU a step is a ResNet-18 student and teacher over 16 images x 10 views (2 x 224 + 8 x 96 px):
about 30 s a step on 2 cores, so `--steps 20` takes some 10 minutes. `--quick` shows the same loop on
the same views working in well under a minute: 4 images a batch and a small CNN for the model.

Each batch's `images` is a list, one tensor per view group, crop-major (view k of sample i at row
k * B + i); the first `--global-groups` groups are the global views (DINOv2's collate stacks both
global crops into one [2B, 3, 224, 224] tensor: torch.cat(images[:2]) is exactly that).
"""
from __future__ import annotations

import fastloader  # noqa: F401  first, so DALI binds nvidia-nvjpeg's nvJPEG, not torchvision's (docs/install.md)

# isort: split
import argparse
import copy
import logging
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

from fastloader import build_loader
from fastloader.errors import ConfigError

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "recipes" / "dinov2.yaml"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(RECIPE), help="a config with train.views (default: the "
                        "DINOv2 recipe on the embedded demo)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--global-groups", type=int, default=2, help="how many view groups are global views")
    parser.add_argument("--out-dim", type=int, default=256, help="the heads' output dimension (DINOv2: 65536)")
    parser.add_argument("--momentum", type=float, default=0.996, help="the teacher's EMA momentum")
    parser.add_argument("--quick", action="store_true", help="4 images a batch and a small CNN for the model: "
                        "the loop shown working on a CPU in well under a minute, where the default ResNet-18 over "
                        "16 images takes about 30 s a step on 2 cores")
    args = parser.parse_args()
    given = args.overrides  # the command line's --set, over the demo's and --quick's settings
    if args.config == str(RECIPE) and not any(o.startswith("dataset.root=") for o in given):
        args.overrides = ["dataset.root=builtin:sample", "train.batch_size=16"]
    else:
        args.overrides = []
    args.overrides += ["train.batch_size=4"] if args.quick else []
    args.overrides += given
    return args


def small_cnn(num_classes: int) -> torch.nn.Module:
    """--quick's model: three strided convolutions, any input size; a step costs milliseconds on a CPU."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, num_classes))


def dino_loss(student: list[torch.Tensor], teacher: list[torch.Tensor], center: torch.Tensor,
              student_temp: float = 0.1, teacher_temp: float = 0.04) -> torch.Tensor:
    """Cross entropy between the teacher's centred, sharpened distribution of each global view and
    the student's of every other view, averaged over the pairs."""
    targets = [F.softmax((t - center) / teacher_temp, dim=-1) for t in teacher]
    total, pairs = 0.0, 0
    for i, target in enumerate(targets):
        for j, out in enumerate(student):
            if i == j:
                continue  # a view is not its own target
            total = total + torch.sum(-target * F.log_softmax(out / student_temp, dim=-1), dim=-1).mean()
            pairs += 1
    return total / pairs


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        loader = build_loader(args.config, split="train", overrides=args.overrides)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    if loader.views is None:
        print(f"{args.config} has no train.views: this loop needs several views of each sample", file=sys.stderr)
        return 2
    device = loader.device
    if args.quick and device.type == "cpu":
        torch.set_num_threads(1)  # a small model's ops are too short to split: each would wait on a busy core
    student = (small_cnn if args.quick else torchvision.models.resnet18)(num_classes=args.out_dim).to(device)
    teacher = copy.deepcopy(student).requires_grad_(False)
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4)
    center = torch.zeros(args.out_dim, device=device)
    step, start = 0, time.perf_counter()
    while step < args.steps:
        for images, _ in loader:  # labels are delivered; the SSL loss does not use them
            count = len(images[0]) // loader.views.groups[0].count
            views = [group[k * count:(k + 1) * count] for group in images for k in range(len(group) // count)]
            global_views = sum(g.count for g in loader.views.groups[:args.global_groups])
            with torch.no_grad():
                teacher_out = [teacher(view) for view in views[:global_views]]
            student_out = [student(view) for view in views]
            loss = dino_loss(student_out, teacher_out, center)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():  # the teacher follows the student; the centre follows the teacher
                for s, t in zip(student.parameters(), teacher.parameters()):
                    t.mul_(args.momentum).add_(s.detach(), alpha=1 - args.momentum)
                center.mul_(0.9).add_(torch.cat(teacher_out).mean(dim=0), alpha=0.1)
            step += 1
            print(f"step {step}: loss {loss.item():.4f}, {len(views)} views of {count} images "
                  f"({', '.join(f'{g.count}x{g.size}px' for g in loader.views.groups)})", flush=True)
            if step >= args.steps:
                break
    print(f"{step} steps in {time.perf_counter() - start:.1f}s; loader waits: {loader.stats.summary()}")
    loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
