"""`fastloader bench`: build a loader from a config and measure it as a trainer would see it."""
from __future__ import annotations

import argparse
import logging
import sys
import time

from . import __version__

log = logging.getLogger("fastloader")

EXAMPLES = """examples:
  fastloader bench configs/sample.yaml
  fastloader bench configs/imagenette.yaml --split val --set dataset.root=/data/imagenette2-320 --batches 50
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastloader", description="Image-classification loading for PyTorch.",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fastloader {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = commands.add_parser("bench", help="iterate a split and report images/s and time to first batch",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("config", help="YAML config file")
    bench.add_argument("--split", default="train", help="split section to read (default: train)")
    bench.add_argument("--backend", choices=("auto", "torch", "dali"), help="override the config's backend")
    bench.add_argument("--batches", type=int, default=0,
                       help="batches to time (default: one epoch); epochs repeat as needed")
    bench.add_argument("--warmup", type=int, default=2, help="batches run before timing starts (default: 2)")
    bench.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set train.batch_size=32 (repeatable)")
    for sub in (parser, bench):
        sub.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        return bench(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a user-facing tool: the message, not a traceback, unless --debug
        if args.debug:
            raise
        print(f"fastloader: error: {error}", file=sys.stderr)
        return 2


def bench(args) -> int:
    from . import build_loader
    overrides = list(args.overrides) + ([f"backend={args.backend}"] if args.backend else [])
    started = time.perf_counter()
    with build_loader(args.config, split=args.split, overrides=overrides) as loader:
        built = time.perf_counter() - started
        per_epoch = len(loader)
        if per_epoch == 0:
            print(f"fastloader: error: split '{args.split}' yields no batch per epoch (see the warning above)",
                  file=sys.stderr)
            return 1
        total = args.batches or per_epoch
        progress = _Progress(args.warmup + total)
        first_batch = shape = dtype = None
        seen = images = 0
        epoch_start = timed_from = time.perf_counter()
        while seen < args.warmup + total:
            for batch_images, labels in loader:
                if first_batch is None:
                    first_batch = time.perf_counter() - epoch_start
                    shape, dtype = list(batch_images.shape), batch_images.dtype
                seen += 1
                if seen <= args.warmup:
                    timed_from = time.perf_counter()
                else:
                    images += len(labels)
                progress.update(seen)
                if seen >= args.warmup + total:
                    break
        _synchronize(loader.device)
        elapsed = time.perf_counter() - timed_from
        progress.finish()
        rate = images / elapsed if elapsed > 0 else float("nan")
        print(f"split {args.split}: backend {loader.backend}, device {loader.device}, "
              f"{_parallelism(loader)}, {loader.num_samples} samples, "
              f"{per_epoch} batches/epoch")
        print(f"batches: {shape} {str(dtype).removeprefix('torch.')}, classes: {', '.join(loader.classes[:8])}"
              f"{' ...' if len(loader.classes) > 8 else ''}")
        print(f"build {built:.2f} s, first batch {first_batch:.2f} s, {images} images timed in {elapsed:.2f} s: "
              f"{rate:.0f} images/s")
    return 0


def _synchronize(device) -> None:
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


class _Progress:
    """One line on a terminal (rewritten in place), a line every 10% otherwise."""

    def __init__(self, total: int):
        self.total, self.tty, self.last = total, sys.stderr.isatty(), -1

    def update(self, done: int) -> None:
        percent = 100 * done // self.total
        if self.tty:
            sys.stderr.write(f"\r{done}/{self.total} batches ({percent}%)")
        elif percent // 10 != self.last // 10:
            sys.stderr.write(f"{done}/{self.total} batches ({percent}%)\n")
        self.last = percent
        sys.stderr.flush()

    def finish(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def _parallelism(loader) -> str:
    """How the loader decodes in parallel: torch workers, or DALI's flavour and threads."""
    info = loader.describe()
    if "flavour" in info:
        return f"{info['flavour']} flavour, {info['threads']} threads"
    return f"{info['workers']} workers"


if __name__ == "__main__":
    sys.exit(main())
