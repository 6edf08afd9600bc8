"""`fastloader tune`: measure the loader on the config's own data on this machine and write the
settings that came out fastest (the search: tuning.py, beside this) to a file a config names
(`tuned: FILE`, docs/config.md#tuned-settings).

Under torchrun or SLURM, rank 0 tunes (for its share of the node's cores, as the node's ranks run
together) and writes the file; the other ranks wait for it, so that every rank reads the same one.
"""
from __future__ import annotations

import datetime
import logging
import os
import time
from pathlib import Path

HELP = "measure the loader's settings on this machine and write the fastest to a file a config names"
EXAMPLES = """  fastloader tune configs/imagenette.yaml --out tuned.yaml
  fastloader tune configs/imagenette.yaml --seconds 3 --step-ms 120
"""
WAIT_MARGIN_S = 600
"""Ranks other than 0 wait for rank 0's file this much longer than its search may take."""


def add_arguments(parser) -> None:
    parser.add_argument("--split", default="train", help="split whose loader is tuned (default: train)")
    parser.add_argument("--out", metavar="FILE",
                        help="the tuned file to write (default: <config>.tuned.yaml beside the config)")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="each trial times at least this long, after its prefetched batches (default: 2)")
    parser.add_argument("--time-limit", type=float, default=125.0,
                        help="the search's seconds: hill-climbing takes about half, measuring the close ones again "
                             "the rest (default: 125)")
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="your model's step in ms per batch: says whether the job waits for data at all")
    parser.add_argument("--ranks-per-node", type=int, default=0,
                        help="ranks that will share this node, each tuned for its share of the cores "
                             "(default: the launcher's LOCAL_WORLD_SIZE or SLURM's, else 1)")


def run(args) -> int:
    from ..config import load_config
    from ..distributed import detect_ranks
    from ..errors import ConfigError
    for name, value in (("--seconds", args.seconds), ("--time-limit", args.time_limit)):
        if not value > 0:
            raise ConfigError(f"{name} must be > 0, got {value}")
    if args.step_ms < 0 or args.ranks_per_node < 0:
        raise ConfigError("--step-ms and --ranks-per-node must be >= 0")
    config = load_config(args.config, args.overrides)
    config.split(args.split)  # a missing split fails before any trial
    out = Path(args.out) if args.out else Path(args.config).with_suffix(".tuned.yaml")
    out.parent.mkdir(parents=True, exist_ok=True)
    ranks = detect_ranks(*config.distributed.given())
    if ranks.rank != 0:
        return wait_for(out, ranks.rank, args.time_limit + WAIT_MARGIN_S)
    from .tuning import report_lines, tune
    started = time.perf_counter()
    quiet = logging.getLogger("fastloader")
    level = quiet.level
    if not args.debug:  # each trial's loader would log its backend and build: the trial's line says it
        quiet.setLevel(logging.WARNING)
    try:
        result = tune(config, args.split, args.seconds, args.ranks_per_node or ranks.local_world_size,
                      args.time_limit, args.step_ms or None)
    finally:
        quiet.setLevel(level)
    for line in report_lines(result):
        print(line)
    write_tuned(out, result, args, time.perf_counter() - started)
    print(f"wrote {out} in {time.perf_counter() - started:.0f} s; use it: `tuned: {out}` in the config, or "
          f"build_loader(config, split, overrides=yaml.safe_load(open({str(out)!r})))")
    return 0


def write_tuned(out: Path, result, args, seconds: float) -> None:
    """The file, whole or not at all (written beside it, then renamed over it)."""
    import yaml
    given = result.given
    head = (f"# fastloader tune {args.config} --split {args.split}, {datetime.datetime.now():%Y-%m-%d %H:%M}, "
            f"{seconds:.0f} s\n"
            f"# chosen: {result.chosen.label}: {result.chosen.rate:.0f} images/s; as given ({given.label}): "
            f"{given.rate:.0f} images/s\n"
            f"# name it in a config (tuned: {out.name}) or pass it as build_loader's overrides\n")
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        partial.write_text(head + yaml.safe_dump(result.settings(), sort_keys=False))
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def wait_for(out: Path, rank: int, timeout: float) -> int:
    """A rank other than 0: wait for rank 0's file, written since this process (launched with rank 0)
    started, and say so."""
    import psutil
    started = psutil.Process().create_time()
    while time.time() - started < timeout:
        if out.exists() and out.stat().st_mtime >= started - 1:
            print(f"rank {rank}: rank 0 wrote {out}; every rank uses it")
            return 0
        time.sleep(1.0)
    from ..errors import ConfigError
    raise ConfigError(f"rank {rank}: rank 0 wrote no {out} within {timeout:.0f} s; see rank 0's output")
