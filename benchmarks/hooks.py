"""What your own transforms cost (docs/transforms.md): the same train split with no hook, an
identity sample hook, an identity batch hook, torchvision v2's RandAugment as a sample hook beside
fastloader's own `rand-m9`, and on the DALI backend an identity graph function, in one run.

Per (backend, case), fresh loaders in interleaved rounds, each warmed by one untimed epoch and then
timed over --epochs epochs: images/s and the training thread's CPU time per sample inside next()
(time.thread_time()), then each case's ratio to the loader without a hook. The issue's bars: an
identity sample hook costs <= 5% images/s on the torch backend (2 workers), an identity batch hook
<= 2% on both backends.

    python benchmarks/hooks.py --data ../shared/data/realphotos [--rounds 3] [--epochs 2]
"""
from __future__ import annotations

import json

import harness
import shards as shard_benchmark
from torchvision.transforms import v2

from fastloader.parallel import available_cores


def identity(image, generator):
    return image


def batch_identity(images, labels, seeds):
    return images, labels


def graph_identity(images, seeds):
    return images


RAND_AUGMENT = v2.RandAugment(num_ops=2, magnitude=9)
"""torchvision's RandAugment at timm's rand-m9's op count and magnitude (torchvision draws each
op's sign and its ops from its own table: the same work, not the same ops)."""

CASES = {  # name: (backend-independent build_loader arguments, train transform keys)
    "no hook": ({}, {}),
    "identity sample hook": ({"sample_hook": identity}, {}),
    "identity batch hook": ({"batch_hook": batch_identity}, {}),
    "torchvision RandAugment hook": ({"sample_hook": RAND_AUGMENT}, {}),
    "fastloader rand-m9": ({}, {"auto_augment": "rand-m9"}),
    "identity graph function": ({"graph_hook": graph_identity}, {}),
}
DALI_ONLY = ("identity graph function",)


def cases_for(backend: str) -> list[str]:
    return [case for case in CASES if backend == "dali" or case not in DALI_ONLY]


def main() -> None:
    parser = harness.epochs_parser(__doc__)
    parser.add_argument("--size", type=int, help="output size (default: the config's)")
    parser.add_argument("--workers", type=int, default=2, help="torch workers / DALI threads")
    parser.add_argument("--backends", nargs="+", default=list(harness.BACKENDS), choices=harness.BACKENDS)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES),
                        help="the cases to time (default: all; 'no hook' is always timed, as the ratios' base)")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    backends = harness.usable_backends(parser, args.backends)
    results: dict = {}
    print(f"data: {data}; {available_cores()} cores; batch {args.batch_size}; {args.workers} workers; "
          f"{args.rounds} rounds, fresh loaders", flush=True)
    for backend in backends:
        config = shard_benchmark.config_for("folder", backend, data, {}, args.batch_size, args.size)
        config["workers"] = {**config.get("workers", {}), "num_workers": args.workers}
        rows: dict[str, list[dict]] = {case: [] for case in cases_for(backend)
                                       if case in args.cases or case == "no hook"}
        for _ in range(args.rounds):
            for case in rows:  # interleaved: the machine's drift falls on all
                hooks, transform = CASES[case]
                train = {**config["train"], "transform": {**config["train"].get("transform", {}), **transform}}
                rows[case].append(harness.warm_epochs({**config, "train": train}, "train", args.epochs, **hooks))
        results[backend] = rows
        harness.ratio_table(f"{backend} train", rows, "no hook", "case")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
