"""What several views of each sample cost (train.views, docs/views.md): DINOv2's 2 x 224 + 8 x 96
crops against one 224 crop per sample, on each backend, and against DINOv2's own transform
(torchvision on PIL images, per view) in a torch DataLoader with as many workers, in one run.

Cases, per backend: `single crop` (224 px, RandomResizedCrop + flip, bicubic: the reference), `single
crop + ops` (the same with the recipe's photometric ops: colour jitter p 0.8, grey p 0.2, blur p 0.5),
`views geometric` (DINOv2's 10 crops, flips only), `views DINOv2` (configs/recipes/dinov2.yaml: colour
jitter p 0.8, grey p 0.2, blur and solarize per view; and the other way of running them, by
`train.view_ops`: `views DINOv2 per view` on the torch backend, each view through its own ops, as
before a group's views were stacked, `views DINOv2 stacked` on DALI, whose default is per view until
a GPU run decides, dali_loader/view_ops.py); and once `DINOv2's transform` (its
DataAugmentationDINO, rewritten from facebookresearch/dinov2's dinov2/data/augmentations.py with
torchvision, over an ImageFolder, collated crop-major as its collate_data_and_cast). Fresh loaders in
interleaved rounds, each warmed by one untimed epoch, then timed over --epochs epochs: samples/s
(each sample with all its views) and the training thread's CPU time per sample inside next().
The bars on 2 cores: views geometric >= 0.40x single crop, views DINOv2 >= 1.5x DINOv2's
transform, and views DINOv2 against single crop + ops >= 0.6x on the torch backend, >= 0.35x on
DALI's CPU flavour; on a GPU, DALI's views geometric >= 0.6x its single crop and views DINOv2 >=
0.4x.

    python benchmarks/views.py --data ../shared/data/realphotos [--rounds 3] [--epochs 2] [--device cuda]
"""
from __future__ import annotations

import importlib
import json
import statistics
from pathlib import Path

import harness
import torch
import torchvision
from PIL import Image
from torchvision import transforms as T

import fastloader
import torch_loader.views as torch_views
from fastloader.config_dump import config_to_raw
from fastloader.parallel import available_cores

RECIPE = harness.REPO_ROOT / "configs" / "recipes" / "dinov2.yaml"


def configs(backend: str, data: Path, batch: int, workers: int, device: str, sizes: tuple[int, int]
            ) -> dict[str, dict]:
    """Each case's config: the DINOv2 recipe over the data (its global and local `sizes`), and its
    single-crop and geometric forms."""
    recipe = config_to_raw(fastloader.load_config(RECIPE))
    for group in recipe["train"]["views"]:
        group["size"] = sizes[0] if group["size"] == 224 else sizes[1]
    recipe.update(backend=backend, output={**recipe["output"], "device": device},
                  workers={**recipe["workers"], "num_workers": workers})
    recipe["dataset"] = {**recipe["dataset"], "root": str(data)}
    recipe["train"] = {**recipe["train"], "batch_size": batch}
    plain = {"size": sizes[0], "scale": [0.32, 1.0], "hflip": 0.5, "interpolation": "bicubic"}
    geometric_views = [{"name": "global", "count": 2, "size": sizes[0], "scale": [0.32, 1.0]},
                       {"name": "local", "count": 8, "size": sizes[1], "scale": [0.05, 0.32]}]
    with_ops = {**recipe["train"]["transform"], **plain, "gaussian_blur_prob": 0.5}
    single = {**recipe, "train": {**recipe["train"], "views": None, "transform": plain}}
    single_ops = {**recipe, "train": {**recipe["train"], "views": None, "transform": with_ops}}
    geometric = {**recipe, "train": {**recipe["train"], "views": geometric_views, "transform": plain}}
    return {"single crop": single, "single crop + ops": single_ops, "views geometric": geometric,
            "views DINOv2": recipe}


BARS = {("torch", "cpu"): 0.6, ("dali", "cpu"): 0.35, ("dali", "cuda"): 0.4}
"""views DINOv2 / single crop + ops on the CPU (issue 58), views DINOv2 / single crop on a GPU."""


class GaussianBlur(T.RandomApply):
    """DINOv2's GaussianBlur: torchvision's, kernel 9, sigma 0.1-2.0, applied with probability p."""

    def __init__(self, p: float):
        super().__init__([T.GaussianBlur(kernel_size=9, sigma=(0.1, 2.0))], p=p)


class DinoV2Transform:
    """DINOv2's DataAugmentationDINO at its defaults (2 global 224 crops at 0.32-1, 8 local 96 crops
    at 0.05-0.32): each view cropped, flipped, jittered and blurred by torchvision from the PIL image."""

    def __init__(self, sizes: tuple[int, int] = (224, 96)):
        def crop(size, scale):
            return T.Compose([T.RandomResizedCrop(size, scale=scale, interpolation=T.InterpolationMode.BICUBIC),
                              T.RandomHorizontalFlip(p=0.5)])
        colour = T.Compose([T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8), T.RandomGrayscale(p=0.2)])
        normalize = T.Compose([T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
        self.global1 = T.Compose([crop(sizes[0], (0.32, 1.0)), colour, GaussianBlur(1.0), normalize])
        self.global2 = T.Compose([crop(sizes[0], (0.32, 1.0)), colour, GaussianBlur(0.1),
                                  T.RandomSolarize(128, p=0.2), normalize])
        self.local = T.Compose([crop(sizes[1], (0.05, 0.32)), colour, GaussianBlur(0.5), normalize])

    def __call__(self, image: Image.Image) -> tuple[list, list]:
        return [self.global1(image), self.global2(image)], [self.local(image) for _ in range(8)]


def dinov2_collate(samples):
    """collate_data_and_cast's layout: the global crops stacked crop-major, then the local ones."""
    n_global, n_local = len(samples[0][0][0]), len(samples[0][0][1])
    global_crops = torch.stack([s[0][0][k] for k in range(n_global) for s in samples])
    local_crops = torch.stack([s[0][1][k] for k in range(n_local) for s in samples])
    return [global_crops, local_crops], torch.tensor([s[1] for s in samples])


def dinov2_epochs(data: Path, batch: int, workers: int, epochs: int, sizes: tuple[int, int]) -> dict:
    """DINOv2's transform in a DataLoader: one epoch untimed, then `epochs` timed, as warm_epochs."""
    dataset = torchvision.datasets.ImageFolder(str(data / "train"), transform=DinoV2Transform(sizes))
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                         collate_fn=dinov2_collate, drop_last=True, persistent_workers=workers > 0)
    for _ in loader:
        pass
    return harness.timed_epochs(loader, epochs)


def main() -> None:
    parser = harness.epochs_parser(__doc__)
    parser.add_argument("--workers", type=int, default=2, help="torch workers / DALI threads, the peer's workers")
    parser.add_argument("--device", default="cpu", help="the loaders' output device (cuda on a GPU)")
    parser.add_argument("--backends", nargs="+", default=list(harness.BACKENDS), choices=harness.BACKENDS)
    parser.add_argument("--no-peer", action="store_true", help="leave DINOv2's own transform out")
    parser.add_argument("--sizes", type=int, nargs=2, default=[224, 96], metavar=("GLOBAL", "LOCAL"),
                        help="the global and local views' sides (default: DINOv2's 224 96)")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    backends = harness.usable_backends(parser, args.backends)
    print(f"data: {data}; {available_cores()} cores; batch {args.batch_size}; {args.workers} workers; device "
          f"{args.device}; {args.rounds} rounds, fresh loaders; samples/s (each sample with all its views)", flush=True)
    results: dict = {}
    peer: list[dict] = []
    for backend in backends:
        cases = configs(backend, data, args.batch_size, args.workers, args.device, tuple(args.sizes))
        rows: dict[str, list[dict]] = {case: [] for case in cases}
        for _ in range(args.rounds):
            for case, config in cases.items():  # interleaved: the machine's drift falls on all
                rows[case].append(harness.warm_epochs(config, "train", args.epochs))
            module = torch_views if backend == "torch" else importlib.import_module("dali_loader.view_ops")
            other = "per_view" if module.STACKS_BY_DEFAULT else "stacked"  # each view through its own ops, or stacked
            recipe = cases["views DINOv2"]
            rows.setdefault(f"views DINOv2 {other.replace('_', ' ')}", []).append(harness.warm_epochs(
                {**recipe, "train": {**recipe["train"], "view_ops": other}}, "train", args.epochs))
            if backend == backends[0] and not args.no_peer:
                peer.append(dinov2_epochs(data, args.batch_size, args.workers, args.epochs, tuple(args.sizes)))
        if peer:
            rows["DINOv2's transform"] = peer
        results[backend] = rows
        harness.ratio_table(f"{backend} train", rows, "single crop", "case")
        rate = {case: statistics.median(r["images_per_s"] for r in runs) for case, runs in rows.items()}
        on_gpu = args.device.startswith("cuda")
        reference = "single crop" if on_gpu else "single crop + ops"
        bar = BARS.get((backend, "cuda" if on_gpu else "cpu"))
        print(f"  views DINOv2 / {reference}: {rate['views DINOv2'] / rate[reference]:.2f}x"
              + (f" (bar >= {bar}x)" if bar else ""))
        if peer:
            ratio = (statistics.median(r["images_per_s"] for r in rows["views DINOv2"]) /
                     statistics.median(r["images_per_s"] for r in peer))
            print(f"  views DINOv2 / DINOv2's transform (bar >= 1.5x): {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
