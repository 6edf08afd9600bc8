"""Both fastloader backends against every peer the targets name, in one interleaved run (harness.py).

Peers, all reading the same JPEGs (the split's files repeated, so an epoch is long like ImageNet's),
with the same workers (DALI: CPU threads), batch size and output size, normalized float batches:
- fastloader torch, and fastloader dali (the CPU flavour where there is no GPU);
- torchvision ImageFolder + DataLoader defaults (peer_loaders.py);
- timm create_loader with its prefetcher, on the output device (skipped, with the reason, without timm:
  pip install -e '.[bench]');
- NVIDIA's ResNet-50 example pipeline on DALI, and fastloader's DALI graph fed by DALI's own file
  reader instead of our sampler (peer_loaders.py; what feeding from Python costs);
- two limits, no transform at all: Pillow full decode only, torchvision decode_jpeg only (whole files:
  the torch backend, which decodes only the crop's region, can pass them).
The DALI peers run on the GPU flavour where CUDA is present (--device cpu for the CPU flavour).
Then the ratios the targets name, the torch backend's time per stage (stages.py) and, with --plot,
images/s per loader with the decode limits as lines.

    python benchmarks/peers.py --data DIR --plot docs/performance.png
    python benchmarks/peers.py --workers 1 --split train --rounds 3 --json peers.json
    python benchmarks/peers.py --torch-decoder auto decode_jpeg --only torch limit   # region vs whole file
    python benchmarks/peers.py --only dali nvidia --device gpu   # the DALI backend against NVIDIA's example
    python benchmarks/peers.py --only dali nvidia --device gpu --reencode-420   # on ImageNet's chroma layout
    python benchmarks/peers.py --only dali nvidia --fancy-upsampling false --nvjpeg-at-least 13.2   # issue 67
    python benchmarks/peers.py --split train --auto-augment rand-m9-mstd0.5-inc1 --only torch timm

--auto-augment POLICY gives the same policy (train split) to fastloader's backends and to timm's
contender; timm runs the closest string Pillow lets it run (timm_policy says which, and why).

Each lane's clock stops after the device has finished its batches (harness.measure); on the GPU
at least GPU_WARMUP warm-up and GPU_BATCHES timed batches. The table gives each lane's prefetch
depth, the GPU's JPEG engines' utilization while it was timed, and what fastloader's DALI backend
decoded on the CPU. --reencode-420 runs on a copy of the data whose JPEGs are re-encoded 4:2:0 at
quality 90, as ImageNet's originals are (the real photos are 78% 4:4:4): made in a temporary folder,
never kept. Where DALI is installed the run first prints which nvJPEG DALI's decoders bind in its
own process (the plan is made for it); --nvjpeg-at-least 13.2 stops before timing where it is older.
--fancy-upsampling sets dali.fancy_upsampling for fastloader's DALI lanes (NVIDIA's example repeats
chroma, nvJPEG's default, whatever it says). .ci/gpu's `judged` parts run these for issue 67.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import harness
import peer_loaders
import stages
import torch
import torch.utils.data
from harness import Factory
from peer_loaders import NVIDIA, READER, TORCHVISION
from PIL import Image

from fastloader.config import IMAGENET_MEAN, IMAGENET_STD
from fastloader.decoding.decode import DECODER_CHOICES, DECODER_ENV
from fastloader.decoding.decode import describe as describe_decoders
from fastloader.samples import SampleIndex

TORCH, DALI, TIMM = "fastloader torch", "fastloader dali", "timm prefetcher"
DALI_PLAIN = "fastloader dali, no policy"
"""With --auto-augment: the DALI backend without the policy, for the cost of its ops."""
PILLOW_LIMIT, DECODE_JPEG_LIMIT = "limit: Pillow decode only", "limit: decode_jpeg only"
LIMITS = (PILLOW_LIMIT, DECODE_JPEG_LIMIT)
TARGETS = {(TORCH, NVIDIA): {"train": 1.0, "val": 1.0}, (DALI, NVIDIA): {"train": 0.95, "val": 0.95},
           (TORCH, DECODE_JPEG_LIMIT): {"train": 0.90, "val": 0.85}}
"""The issues' targets per split: ratio of medians measured in the same run."""
POLICY_TARGETS = {(TORCH, TIMM): {"train": 1.5}, (DALI, DALI_PLAIN): {"train": 0.5}}
"""With --auto-augment (issue 25): the torch backend against timm given the same policy; the DALI
backend with the policy against itself without (0.9 on a GPU)."""
GPU_WARMUP, GPU_BATCHES = 10, 100
"""The fewest warm-up and timed batches a GPU lane gets: a GPU loader's ready queue and its first
batches' set-up would flatter or penalize a short count."""
GPU_TARGETS = {(DALI, NVIDIA): {"train": 1.1, "val": 1.1}}
"""On a GPU (issue 67): the DALI backend at least 1.1x NVIDIA's example, on the photos as they are and
re-encoded 4:2:0 (--reencode-420)."""
CPU_ONLY_TARGETS = {(TORCH, NVIDIA)}
"""Targets that compare CPU decoding with CPU decoding: the torch backend against NVIDIA's example
holds only where that example runs DALI's CPU flavour, not against nvJPEG on a GPU."""
RATIOS = [(TORCH, NVIDIA), (DALI, NVIDIA), (TORCH, TORCHVISION), (TORCH, TIMM), (DALI, TORCHVISION),
          (TORCH, DALI), (TORCH, DECODE_JPEG_LIMIT), (DALI, READER), (DALI, DALI_PLAIN)]


def _skipped() -> dict[str, str]:
    """Peers that cannot run here, with the reason (printed once)."""
    reasons = {}
    try:
        import timm  # noqa: F401
    except ImportError as error:
        reasons[TIMM] = f"timm is not installed ({error}); pip install -e '.[bench]' adds it"
    if peer_loaders.NO_DALI:
        reasons.update(dict.fromkeys((DALI, NVIDIA, READER), peer_loaders.NO_DALI))
    return reasons


SKIPPED = _skipped()


class DecodeOnly(torch.utils.data.Dataset):
    """The split's files, decoded whole and thrown away: what decoding alone allows, a ceiling."""

    def __init__(self, paths: list[str], labels: list[int], decoder: str):
        self.paths, self.labels, self.decoder = paths, labels, decoder

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.decoder == "pillow":
            with Image.open(self.paths[i]) as image:
                image.convert("RGB").load()
        else:
            harness.decode_whole_file(self.paths[i])
        return torch.empty(0, dtype=torch.uint8), self.labels[i]


def decode_limit_factory(paths: list[str], labels: list[int], decoder: str, train: bool,
                         args: argparse.Namespace) -> Factory:
    dataset = DecodeOnly(paths, labels, decoder)

    def build():
        return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=train,
                                           num_workers=args.workers), lambda: None
    return build


def timm_policy(policy: str | None) -> tuple[str | None, str]:
    """The auto_augment string timm's contender runs, and why it differs from ours where it does:
    timm 1.0's increasing posterize asks Pillow for 0 bits at magnitude 10 (reached by mstd noise),
    which Pillow 13 refuses, so `inc1` becomes timm's default op set."""
    import PIL
    if not policy or "-inc1" not in policy or int(PIL.__version__.split(".")[0]) < 13:
        return policy, ""
    closest = policy.replace("-inc1", "")
    return closest, (f"timm runs {closest!r} for --auto-augment {policy!r}: its increasing posterize keeps 0 bits "
                     f"at magnitude 10, which Pillow {PIL.__version__} refuses (ImageOps.posterize: bits 0)")


def timm_factory(split_dir: Path, repeat: int, train: bool, args: argparse.Namespace) -> Factory:
    """timm's ImageDataset and create_loader with its prefetcher (normalizes on the output device),
    RandomResizedCrop + flip without colour jitter for train, crop_pct 0.875 for eval; for train,
    --auto-augment's policy (timm_policy's string)."""
    from timm.data import ImageDataset, create_loader
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def build():
        dataset = ImageDataset(str(split_dir))
        dataset.reader.samples = dataset.reader.samples * repeat
        loader = create_loader(dataset, input_size=(3, args.size, args.size), batch_size=args.batch_size,
                               is_training=train, num_workers=args.workers, device=device, use_prefetcher=True,
                               color_jitter=None, crop_pct=0.875, interpolation="bilinear",
                               auto_augment=timm_policy(args.auto_augment)[0] if train else None,
                               mean=IMAGENET_MEAN, std=IMAGENET_STD, pin_memory=device.type == "cuda")
        return loader, lambda: None
    return build


def torch_peer_name(choice: str, args: argparse.Namespace) -> str:
    """The torch backend's peer name: plain for the first --torch-decoder, the choice named otherwise."""
    return TORCH if choice == args.torch_decoder[0] else f"{TORCH}, {DECODER_ENV}={choice}"


def with_decoder(choice: str, build: Factory) -> Factory:
    """The torch backend with FASTLOADER_JPEG_DECODER=choice: its workers, started when the loader is
    first iterated, inherit it (the next peer's build sets its own)."""
    def build_with_decoder():
        os.environ[DECODER_ENV] = choice
        return build()
    return build_with_decoder


def build_peers(split: str, split_dir: Path, index: SampleIndex, list_path: Path, repeat: int,
                args: argparse.Namespace) -> dict[str, Factory]:
    train = split == "train"
    policy = {f"{split}.transform.auto_augment": args.auto_augment} if train and args.auto_augment else {}
    overrides = harness.fastloader_overrides(split, split_dir, index, list_path, args, repeat, backend="torch",
                                             **{"output.device": "cpu", "workers.num_workers": args.workers}, **policy)
    peers = {torch_peer_name(choice, args): with_decoder(choice, harness.fastloader_factory(split, overrides))
             for choice in args.torch_decoder}
    paths, labels = harness.listed_files(index, repeat)
    if DALI not in SKIPPED:
        peers.update(dali_peers(split, split_dir, index, list_path, repeat, paths, labels, args, policy))
    peers[TORCHVISION] = peer_loaders.torchvision_factory(split, split_dir, repeat, args.batch_size, args.size,
                                                          args.workers)
    if TIMM not in SKIPPED:
        peers[TIMM] = timm_factory(split_dir, repeat, train, args)
    peers[PILLOW_LIMIT] = decode_limit_factory(paths, labels, "pillow", train, args)
    peers[DECODE_JPEG_LIMIT] = decode_limit_factory(paths, labels, "decode_jpeg", train, args)
    if args.only:
        peers = {name: build for name, build in peers.items()
                 if any(text.lower() in name.lower() for text in args.only)}
    return peers


def dali_peers(split: str, split_dir: Path, index: SampleIndex, list_path: Path, repeat: int, paths: list[str],
               labels: list[int], args: argparse.Namespace, policy: dict) -> dict[str, Factory]:
    """fastloader's DALI backend (with --auto-augment's `policy`, and without it), NVIDIA's example
    (its own graph, no policy) and our graph on DALI's reader, in the --device flavour."""
    gpu = args.device == "gpu"
    plain = harness.fastloader_overrides(
        split, split_dir, index, list_path, args, repeat, backend="dali",
        **{"output.device": "cuda" if gpu else "cpu", "dali.threads": args.workers, "workers.prefetch_factor": 2,
           "dali.fancy_upsampling": FANCY[args.fancy_upsampling]})
    overrides = {**plain, **policy}
    batch, threads = args.batch_size, args.workers
    peers = {DALI: harness.fastloader_factory(split, overrides)}
    if policy:
        peers[DALI_PLAIN] = harness.fastloader_factory(split, plain)
    return {**peers, NVIDIA: peer_loaders.nvidia_example_factory(paths, labels, split == "train", gpu, args.size,
                                                                 batch, threads),
            READER: peer_loaders.reader_factory(paths, labels, split, gpu, overrides, batch, threads)}


FANCY = {"auto": "auto", "true": True, "false": False}
"""--fancy-upsampling's words as dali.fancy_upsampling's values."""


def bound_nvjpeg_line(at_least: str | None) -> str:
    """The nvJPEG DALI's decoders bind in this process (dali_loader.stack, as the loader plans for it),
    checked before anything is timed: with --nvjpeg-at-least, a lower one stops the run (its figures
    would measure regions sent to the CPU, issue 67)."""
    from dali_loader.stack import dali_cuda_major, decoders_nvjpeg
    bound = decoders_nvjpeg(dali_cuda_major())
    version = bound.version if bound is not None else None
    words = f"nvJPEG DALI's decoders bind in this process: {'.'.join(map(str, version or ())) or 'none'} " \
            f"({bound.path if bound is not None else 'not found'})"
    if at_least and (version is None or version[:2] < tuple(int(part) for part in at_least.split("."))):
        sys.exit(f"{words}, below --nvjpeg-at-least {at_least}: stopped before timing")
    return words


def print_targets(results: dict, device: str, policy: bool = False) -> None:
    print("\ntargets (ratio of medians in this run):")
    targets = {**TARGETS, **POLICY_TARGETS} if policy else dict(TARGETS)
    if device == "gpu":
        targets.update(GPU_TARGETS)
    if policy and device == "gpu":
        targets[(DALI, DALI_PLAIN)] = {"train": 0.9}
    for split, result in results.items():
        ratios = result["summary"]["ratios"]
        for (a, b), per_split in targets.items():
            if device == "gpu" and (a, b) in CPU_ONLY_TARGETS:
                continue
            ratio, target = ratios.get(f"{a} / {b}"), per_split.get(split)
            if ratio is not None and target is not None:
                verdict = "met" if ratio >= target else "MISSED"
                print(f"  {split}: {a} / {b} = {ratio:.2f}x, target >= {target:.2f}x: {verdict}")


def plot(results: dict, hardware: dict, args: argparse.Namespace, path: Path) -> None:
    """Bars: images/s per loader and split; dashed lines: the decode-only limits."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    splits = list(results)
    loaders = [name for name in results[splits[0]]["summary"] if name not in ("ratios", *LIMITS)]
    figure, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 4.5), squeeze=False)
    for axis, split in zip(axes[0], splits):
        summary = results[split]["summary"]
        medians = [summary[name]["median"] for name in loaders]
        bars = axis.barh(loaders[::-1], medians[::-1], color=["C0" if name.startswith("fastloader") else "C7"
                                                               for name in loaders[::-1]])
        axis.bar_label(bars, fmt="%.0f", padding=3)
        for limit, style in zip(LIMITS, ("--", ":")):
            if limit in summary:
                axis.axvline(summary[limit]["median"], color="C3", linestyle=style, label=limit)
        axis.set_title(f"{split}: {'random-resized-crop + flip' if split == 'train' else 'resize + centre crop'}")
        axis.set_xlabel("images/s (median of rounds)")
        axis.legend(loc="lower right", fontsize=8)
    figure.suptitle(f"{hardware['cpu']}, {hardware['cpu_cores']} cores: {args.workers} workers/threads, "
                    f"batch {args.batch_size}, {args.size} px", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    print(f"wrote {path}")


def report(args: argparse.Namespace):
    def after_tables(results: dict, hardware: dict) -> dict:
        print_targets(results, args.device, bool(args.auto_augment))
        per_stage = None
        if any(name.startswith(TORCH) for result in results.values() for name in result["measurements"]):
            os.environ[DECODER_ENV] = args.torch_decoder[0]  # the per-stage times are those of the first choice
            per_stage = stages.measure(args.data, list(results), args.batch_size, args.size, args.rounds)
            stages.print_stages(per_stage)
        if args.plot:
            plot(results, hardware, args, args.plot)
        return {"skipped": SKIPPED, "stages": per_stage}
    return after_tables


if __name__ == "__main__":
    parser = harness.base_parser(__doc__)
    parser.add_argument("--plot", type=Path, help="write a PNG of images/s per loader, e.g. docs/performance.png")
    parser.add_argument("--torch-decoder", nargs="+", choices=list(DECODER_CHOICES), default=["auto"],
                        help=f"the torch backend once per {DECODER_ENV} value (default: auto); the first is the "
                             "one the targets and the per-stage times are about")
    parser.add_argument("--only", nargs="+", metavar="TEXT",
                        help="measure only the peers whose name contains one of these (any case), "
                             "e.g. --only torch limit")
    parser.add_argument("--auto-augment", metavar="POLICY",
                        help="train split: this auto_augment policy for fastloader and timm, e.g. "
                             "rand-m9-mstd0.5-inc1")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu" if torch.cuda.is_available() else "cpu",
                        help="the DALI peers' flavour (default: gpu where CUDA is available, else cpu)")
    parser.add_argument("--reencode-420", action="store_true",
                        help="run on the data's JPEGs re-encoded 4:2:0 at quality 90 (ImageNet's layout), in a "
                             "temporary copy")
    parser.add_argument("--fancy-upsampling", choices=list(FANCY), default="auto",
                        help="dali.fancy_upsampling of fastloader's DALI backend and our graph + DALI reader "
                             "(default: auto, the config's default)")
    parser.add_argument("--nvjpeg-at-least", metavar="MAJOR.MINOR",
                        help="stop before timing where DALI's decoders bind an older nvJPEG, e.g. 13.2")
    arguments = harness.check_args(parser, parser.parse_args())
    if arguments.device == "gpu" and (arguments.warmup < GPU_WARMUP or arguments.batches < GPU_BATCHES):
        arguments.warmup, arguments.batches = max(arguments.warmup, GPU_WARMUP), max(arguments.batches, GPU_BATCHES)
        print(f"note: on the GPU each lane takes at least {GPU_WARMUP} warm-up and {GPU_BATCHES} timed batches: "
              f"--warmup {arguments.warmup} --batches {arguments.batches}")
    if arguments.workers < 1:
        parser.error("--workers must be >= 1: DALI needs at least one CPU thread")
    if arguments.device == "gpu" and not torch.cuda.is_available():
        parser.error("--device gpu: no CUDA device here; pass --device cpu")
    if arguments.auto_augment:
        from fastloader.augment.policy import parse_policy
        print(f"train split: auto_augment {parse_policy(arguments.auto_augment).describe()}")
        if TIMM not in SKIPPED and timm_policy(arguments.auto_augment)[1]:
            print(f"note: {timm_policy(arguments.auto_augment)[1]}")
    for peer, reason in SKIPPED.items():
        print(f"skipped {peer}: {reason}")
    info = f", DALI {__import__('nvidia.dali').dali.__version__} ({arguments.device} flavour, dali.fancy_upsampling " \
        f"{arguments.fancy_upsampling})" if DALI not in SKIPPED else ""
    if DALI not in SKIPPED:
        nvjpeg = bound_nvjpeg_line(arguments.nvjpeg_at_least)
        print(nvjpeg, flush=True)
        info += f"\n{nvjpeg}"
    if arguments.device == "gpu":
        info += f", GPU {torch.cuda.get_device_name(0)}"
    os.environ[DECODER_ENV] = arguments.torch_decoder[0]
    info += f"\ntorch backend decoders: {describe_decoders()}"
    ratios = RATIOS + [(torch_peer_name(choice, arguments), DECODE_JPEG_LIMIT)
                       for choice in arguments.torch_decoder[1:]]
    with harness.reencoded_420(arguments.data, arguments.reencode_420) as data:
        arguments.data = data
        sys.exit(harness.main(arguments, build_peers, "peers", info, ratios=ratios, report=report(arguments)))
