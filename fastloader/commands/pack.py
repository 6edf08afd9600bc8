"""`fastloader pack`: write a split (folders, a file list, or shards) as WebDataset tar shards with
`.cls` labels, for clusters whose filesystems are slow at millions of small files. The writing is
fastloader/packing.py; this module reads the command line and says how to read the shards.

The module imports only the standard library (and fastloader.words, which does too) at its top: the
command line imports every command.
"""
from __future__ import annotations

import os

from ..units import parse_size
from ..words import plural

HELP = ("write a split as WebDataset tar shards ({key}.jpg + {key}.cls, and the class names) that "
        "dataset.format: webdataset reads")
EXAMPLES = """  fastloader pack configs/imagenette.yaml --split train --out /lustre/imagenette-wds
  fastloader pack configs/imagenette.yaml --split val --out shards/ --shard-size 64MB --no-shuffle
"""
def add_arguments(parser) -> None:
    parser.add_argument("--split", required=True, metavar="NAME", help="the split to pack")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the shards (created if needed)")
    parser.add_argument("--prefix", metavar="NAME", help="shard names: NAME-000000.tar ... (default: the split)")
    parser.add_argument("--shard-size", default="256MB", metavar="SIZE",
                        help="image bytes per shard at most, with a unit: B, K, M, G or T (powers of 1024), e.g. "
                             "256MB or 1G (default: 256MB)")
    parser.add_argument("--per-shard", type=int, metavar="N", help="samples per shard at most")
    parser.add_argument("--no-shuffle", action="store_true",
                        help="keep the index's order (default: a seeded shuffle, so each shard mixes classes)")
    parser.add_argument("--seed", type=int, default=0, help="the shuffle's seed (default: 0)")
    parser.add_argument("--follow-links", action="store_true",
                        help="also pack files that symbolic links in the dataset point to outside dataset.root "
                             "(default: leave them out, each named)")


def run(args) -> int:
    from ..config import load_config
    from ..errors import ConfigError
    from ..packing import check_prefix, output_folder, pack_index, shard_pattern
    from ..sources.folder import dataset_root
    from ..sources.formats import build_index
    from ..sources.webdataset import CLASSES_FILE

    config = load_config(args.config, args.overrides)
    if args.split not in config.splits:
        raise ConfigError(f"--split: {config.source} has no split {args.split!r}; its splits: "
                          f"{', '.join(config.splits) or 'none'}")
    if args.per_shard is not None and args.per_shard < 1:
        raise ConfigError(f"--per-shard: must be 1 or more, got {args.per_shard}")
    prefix = args.prefix or args.split
    check_prefix(prefix, "--prefix" if args.prefix else "--split (the default --prefix)")
    max_bytes = parse_size(args.shard_size, "--shard-size")
    out = os.path.abspath(args.out)
    output_folder(out)  # before indexing: a bad --out fails at once
    index = build_index(config, config.split(args.split))
    inside = None if args.follow_links or config.dataset.format != "folder" else dataset_root(config)
    packed = pack_index(config, index, out, prefix, max_bytes=max_bytes, max_count=args.per_shard,
                        shuffle_seed=None if args.no_shuffle else args.seed, inside=inside)
    if not packed.shards:
        raise ConfigError(f"split {args.split!r}: no sample could be packed, so no shard was written")
    skipped = (f"; {plural(len(packed.skipped), 'file')} left out (unreadable, not an image, or a link out of the "
               f"dataset; each named above)") if packed.skipped else ""
    print(f"split {args.split}: {plural(packed.samples, 'sample')}, {packed.bytes / 1e9:.2f} GB in "
          f"{plural(len(packed.shards), 'shard')} -> {out}{skipped}")
    classes = os.path.join(out, CLASSES_FILE.format(prefix=prefix))
    print(f"to read them (the loader reads the class names in label order from {classes}, beside them):\n"
          f"  dataset: {{format: webdataset, classes: {classes}}}\n"
          f"  {args.split}: {{shards: {os.path.join(out, shard_pattern(packed.shards))}}}")
    return 0
