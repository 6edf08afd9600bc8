"""Train a torchvision classifier on fastloader batches: one process, or DDP under torchrun/srun.

    .venv/bin/python examples/train.py configs/sample.yaml --epochs 2
    .venv/bin/torchrun --nproc_per_node=2 examples/train.py configs/sample.yaml --checkpoint run/ckpt.pt

With mixup, cutmix or label smoothing on (a recipe in configs/recipes/), the loader's labels are soft
targets, float [B, num_classes], and the loss is the soft-target cross entropy; otherwise they are
class indices and the loss is plain cross entropy: the loss follows the targets' dtype.

With --checkpoint, rank 0 saves the model, the optimizer and the train loader's state every
--save-every steps, at the end of each epoch and on Ctrl-C (after the step under way: press it twice
to stop at once); starting again with the same command resumes exactly where the checkpoint left
off, mid-epoch included. The loader does the sharding; this script only wraps the model in DDP.
--sample-hook and --batch-hook add your own transforms (docs/transforms.md; examples/my_transforms.py
holds one of each); a checkpoint records them, and resuming with others is refused.
Works on CPU (gloo) and GPU (nccl, one GPU per local rank). A config error prints its message and
exits with status 2; Ctrl-C exits with 130.
"""
from __future__ import annotations

import fastloader  # noqa: F401  first, so DALI binds nvidia-nvjpeg's nvJPEG, not torchvision's (docs/install.md)

# isort: split
import argparse
import logging
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torchvision

from fastloader import build_loader
from fastloader.errors import BadImageError, ConfigError

INTERRUPTED = 130
"""The exit status after Ctrl-C, as a shell gives it (128 + SIGINT)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="fastloader YAML config with a train and a val split")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.batch_size=64 (repeatable)")
    parser.add_argument("--model", default="resnet18", help="a torchvision model name (default: resnet18)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate for a global batch of 256")
    parser.add_argument("--checkpoint", help="file to save to and resume from")
    parser.add_argument("--save-every", type=int, default=100, metavar="STEPS")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="stop after this many steps of this run, saving a checkpoint (as a preemption would)")
    parser.add_argument("--log-every", type=int, default=10, metavar="STEPS")
    parser.add_argument("--sample-hook", metavar="MODULE:FUNCTION",
                        help="your own op on each train sample (train.transform.sample_hook; docs/transforms.md), "
                             "e.g. my_transforms:RAND_AUGMENT (examples/my_transforms.py)")
    parser.add_argument("--batch-hook", metavar="MODULE:FUNCTION",
                        help="your own op on each train batch (train.transform.batch_hook), e.g. "
                             "my_transforms:brightness")
    args = parser.parse_args()
    args.overrides += [f"train.transform.{key}={value}" for key, value in
                       (("sample_hook", args.sample_hook), ("batch_hook", args.batch_hook)) if value]
    return args


def say(*parts) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*parts, flush=True)


def loss_for(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy against class indices (int64 [B]) or soft targets (float [B, C], rows summing to 1:
    timm's SoftTargetCrossEntropy), whichever the loader yields."""
    if targets.is_floating_point():
        return torch.sum(-targets * torch.log_softmax(logits.float(), dim=1), dim=1).mean()
    return torch.nn.functional.cross_entropy(logits, targets)


def save(path: str, model, optimizer, train, step: int) -> None:
    """Rank 0 writes; every rank's loader state is the same (ranks step together)."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    model = getattr(model, "module", model)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "train_loader": train.state_dict(),
             "step": step}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # a job killed while saving keeps the previous checkpoint


class CtrlC:
    """Ctrl-C asks the run to stop after the step under way (a second one stops it at once). Every rank
    of a DDP job agrees on the step, so that they all save the same state and leave together."""

    def __init__(self):
        self.asked = False
        signal.signal(signal.SIGINT, self._ask)

    def _ask(self, number, frame) -> None:
        self.asked = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the second Ctrl-C: KeyboardInterrupt
        say("Ctrl-C: stopping after this step (Ctrl-C again to stop at once)")

    def agreed(self) -> bool:
        """Whether any rank was asked to stop (a collective in DDP: every rank calls it after each step)."""
        if not dist.is_initialized():
            return self.asked
        flag = torch.tensor([int(self.asked)], dtype=torch.int32, device="cpu")  # gloo: no wait for the GPU
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.asked = bool(flag.item())  # a rank that was not asked stops too
        return self.asked

    def batches(self, loader):
        """The loader's batches; after Ctrl-C, a loader whose worker processes the same Ctrl-C ended
        ends the loop instead of failing (its state still counts only the batches trained on)."""
        batches = iter(loader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception:
                if self.asked:
                    return
                raise
            yield batch


def evaluate(model, val) -> tuple[float, int]:
    """Accuracy over the whole val split: each rank scores its shard, the sums are all-reduced.

    The bare module runs, not DDP's wrapper: ranks may hold different numbers of val batches, and
    DDP's forward could wait for a collective on a rank that has already finished.
    """
    model = getattr(model, "module", model)
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=val.device)  # on the batches' device: no sync per batch
    scored = 0
    with torch.no_grad():
        for images, labels in val:
            correct += (model(images).argmax(1) == labels).sum()
            scored += len(labels)
    totals = torch.tensor([float(correct), float(scored)], dtype=torch.float64, device=val.device)
    if dist.is_initialized():
        dist.all_reduce(totals)
    model.train()
    return float(totals[0] / totals[1]), int(totals[1])


def main() -> int:
    """Train; the exit status: 0 done, 2 a config or data error (its message, no traceback), 130 Ctrl-C."""
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # the loaders' lines
    try:
        return train(args)
    except (ConfigError, BadImageError) as error:  # errors that name the key or file and the fix
        print(f"{os.path.basename(sys.argv[0])}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the second Ctrl-C
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


def train(args) -> int:
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:  # torchrun (or srun with its variables)
        # gloo for CPU tensors and NCCL for CUDA ones, both named: a run whose output.device is cpu
        # must work on a GPU machine too, and torch 2.11 with no backend named gives CPU tensors none
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    train = build_loader(args.config, "train", args.overrides)
    val = build_loader(args.config, "val", args.overrides)
    device, world = train.device, train.ranks.world_size
    if len(train) == 0:  # drop_last with a batch larger than the split: no step would run, the loss nan
        raise ConfigError(f"split 'train' yields no batch per epoch ({train.num_samples} samples on this rank, "
                          f"batch_size {train.batch_size}, drop_last: true); lower train.batch_size or set "
                          f"train.drop_last: false (`fastloader check` says so too)")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = torchvision.models.get_model(args.model, num_classes=train.num_classes).to(device)
    dtype = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}[train.config.output.dtype]
    lr = args.lr * train.batch_size * world / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-5)

    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        try:  # the next loop continues the saved epoch
            train.load_state_dict(saved["train_loader"])
        except ValueError as error:  # saved with another split, seed, order or hooks: named, with the fix
            raise ConfigError(f"{args.checkpoint}: {error}") from None
        step = saved["step"]
        resumed = train.state_dict()  # where the next loop starts: a saved end of epoch is the next one's start
        say(f"resumed from {args.checkpoint}: step {step}, epoch {resumed['epoch']}, "
            f"sample {resumed['position']} of {train.num_samples}")
    if dist.is_initialized():
        device_ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    say(f"{args.model} on {world} rank(s), {train.backend} backend, device {device}, global batch "
        f"{train.batch_size * world}, {len(train)} steps per epoch")

    steps_this_run = 0
    ctrl_c = CtrlC()
    for epoch in range(train.next_epoch, args.epochs):
        started, images_seen, loss = time.perf_counter(), 0, torch.tensor(float("nan"), device=device)
        sides = set()  # the train sizes of the epoch: one (progressive resolution) or several (a size per batch)
        for images, labels in ctrl_c.batches(train):
            sides.add(images.shape[-1])  # after a resume, the first loop is the rest of the saved epoch
            if steps_this_run == 0:
                soft = labels.is_floating_point()
                say("targets: " + ("soft, float [B, num_classes]: soft-target cross entropy" if soft
                                   else "class indices, int64 [B]: cross entropy"))
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_for(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step, steps_this_run, images_seen = step + 1, steps_this_run + 1, images_seen + len(labels) * world
            if step % args.log_every == 0:
                rate = images_seen / (time.perf_counter() - started)
                say(f"epoch {epoch} step {step} loss {loss.item():.3f} {rate:.0f} images/s")
            if args.checkpoint and step % args.save_every == 0:
                save(args.checkpoint, model, optimizer, train, step)
            if steps_this_run == args.max_steps:
                if args.checkpoint:
                    save(args.checkpoint, model, optimizer, train, step)
                say(f"stopped after {steps_this_run} steps (--max-steps) at epoch {epoch}, step {step}")
                return finish(train, val)
            if ctrl_c.agreed():
                break
        if ctrl_c.asked:
            if args.checkpoint:
                save(args.checkpoint, model, optimizer, train, step)
            say(f"interrupted at epoch {epoch}, step {step}: " + (
                f"saved {args.checkpoint}; the same command resumes from it" if args.checkpoint else
                "nothing saved (no --checkpoint)"))
            finish(train, val)
            return INTERRUPTED
        seconds = time.perf_counter() - started
        val.set_epoch(epoch)  # its log says the epoch it evaluates, after a resume too
        accuracy, scored = evaluate(model, val)
        say(f"epoch {epoch} done: loss {loss.item():.3f}, val accuracy {accuracy:.3f} on {scored} images, "
            f"{images_seen / seconds:.0f} images/s, train size {'/'.join(map(str, sorted(sides)))} px")
        if args.checkpoint:
            save(args.checkpoint, model, optimizer, train, step)
    return finish(train, val)


def finish(*loaders) -> int:
    for loader in loaders:
        loader.close()
    if dist.is_initialized():
        dist.barrier()  # leave together: gloo may abort a rank whose peers already closed their sockets
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
