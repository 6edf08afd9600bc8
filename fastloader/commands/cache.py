"""`fastloader cache`: decode every image of a split once into the uint8 cache that `dataset.cache`
reads. The writing itself is fastloader/cache_write.py; this module reads the command line and
reports what was written.

The module imports only the standard library at its top (cache_write's too): the command line
imports every command module to build its parser.
"""
from __future__ import annotations

import os

from ..cache_format import DEFAULT_SHORT_SIDE
from ..words import plural

HELP = "decode a split once into a uint8 cache that dataset.cache reads through memmap"
EXAMPLES = """  fastloader cache configs/sample.yaml --split train --out /scratch/sample-cache
  fastloader cache configs/imagenette.yaml --split train --short-side 256 --set dataset.cache=/scratch/in-cache
"""


def add_arguments(parser) -> None:
    parser.add_argument("--split", action="append", metavar="NAME",
                        help="split to cache (repeatable; default: every split of the config)")
    parser.add_argument("--short-side", type=int, default=DEFAULT_SHORT_SIDE, metavar="PX",
                        help=f"shrink images so that their shorter side is at most PX, keeping the aspect ratio; "
                             f"smaller images are kept as they are (default: {DEFAULT_SHORT_SIDE})")
    parser.add_argument("--out", metavar="DIR",
                        help="cache folder, the value for dataset.cache; each split goes to DIR/<split> "
                             "(default: dataset.cache of the config)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="decoding processes (default: the CPU cores available)")


def run(args) -> int:
    from ..cache_write import build_split_cache
    from ..config import load_config
    from ..errors import ConfigError
    from ..sources.formats import build_index

    config = load_config(args.config, args.overrides)
    out = os.path.abspath(args.out) if args.out else config.dataset.cache
    if not out:
        raise ConfigError(f"{config.source}: where should the cache go? Pass --out DIR (then set dataset.cache: DIR "
                          f"for the loaders) or set dataset.cache in the config; put it on fast local or "
                          f"parallel storage, it holds about N x S x 1.33 S x 3 bytes for --short-side S")
    if args.short_side < 1:
        raise ConfigError(f"--short-side: must be a positive number of pixels, got {args.short_side}")
    if args.workers is not None and args.workers < 0:
        raise ConfigError(f"--workers: must be 0 or more, got {args.workers}")
    names = args.split or list(config.splits)
    if not names:
        raise ConfigError(f"{config.source}: no split sections to cache; add one, e.g. 'train: {{}}'")
    for name in names:
        split = config.split(name)
        report = build_split_cache(config, split, build_index(config, split), out, args.short_side, args.workers)
        bad = f"; {plural(len(report['bad']), 'bad file')} listed in its manifest" if report["bad"] else ""
        print(f"split {name}: {plural(report['images'], 'image')}, {report['bytes'] / 1e9:.2f} GB in "
              f"{report['seconds']:.1f} s "
              f"({report['images'] / max(report['seconds'], 1e-9):.0f} images/s) -> {report['folder']}{bad}")
    if out != config.dataset.cache:
        print(f"to read it, set dataset.cache in the config\n  dataset: {{cache: {out}}}\n"
              f"or pass --set dataset.cache={out}")
    return 0
