"""Shared fixtures: small real image datasets written by the tests themselves."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from objectstore import object_store, object_store_server  # noqa: F401  (fixtures: a real local S3 server)
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
PHOTOS_ENV = "FASTLOADER_PHOTOS"
REALPHOTOS = Path(os.environ.get(PHOTOS_ENV) or REPO.parent / "shared" / "data" / "realphotos")
"""The real photos `realdata` tests read: 500 ImageNet JPEGs, train/ (400) and val/ (100) in 10 class
folders. Where $FASTLOADER_PHOTOS names a folder, that one (as in .ci/gpu); else the shared copy
beside the checkout."""

# Solid colours per class: after any crop and resize the pixels stay this colour, so tests can
# check normalized values exactly. Class folder names sort as the labels: a_red=0, b_green=1, c_blue=2.
COLOURS = {"a_red": (200, 30, 40), "b_green": (20, 180, 60), "c_blue": (30, 50, 220)}
SIZES = [(64, 48), (48, 64), (80, 80), (100, 60), (60, 90)]


LONGEST_FILES = ("test_example.py", "test_benchmarks.py", "test_cache.py", "test_workers_and_signals.py",
                 "test_plain_scripts.py", "test_remote.py", "test_readme.py", "test_cli.py", "test_bench.py")
"""The suite's longest files, longest first (`--junitxml` times summed per file): `-n 2 --dist
loadfile` hands each worker whole files in the order they are collected, and a long file collected
last ran on one core while the other had nothing left (about 25 s of the suite's 9.5 min)."""


def pytest_collection_modifyitems(items):
    """The longest files first, the rest in their order."""
    rank = {name: place for place, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))

@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch, tmp_path_factory):
    """No test sees a backend forced from outside, and the demo dataset goes to a temp cache."""
    monkeypatch.delenv("FASTLOADER_BACKEND", raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                 "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FASTLOADER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fastloader-cache"))


def write_solid_dataset(root: Path, per_class: int = 5, splits=("train", "val"), fmt: str = "PNG") -> Path:
    """root/<split>/<class>/img_XX.png, each image one solid colour; sizes vary."""
    for split in splits:
        for name, colour in COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                size = SIZES[i % len(SIZES)]
                suffix = ".png" if fmt == "PNG" else ".jpg"
                Image.new("RGB", size, colour).save(folder / f"img_{i:02d}{suffix}", format=fmt)
    return root


def write_textured_dataset(root: Path, per_class: int = 8, splits=("train", "val")) -> Path:
    """Noisy gradients, so that different crops give different pixels."""
    rng = np.random.default_rng(0)
    for split in splits:
        for c, name in enumerate(COLOURS):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                w, h = SIZES[i % len(SIZES)]
                y, x = np.mgrid[0:h, 0:w]
                base = np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 80 * c)], axis=-1)
                noise = rng.integers(0, 40, size=(h, w, 3))
                Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(folder / f"t_{i:02d}.png")
    return root


def write_gradient_dataset(root: Path, per_class: int = 20, size=(200, 150)) -> Path:
    """train/<class>/g_XX.png whose red channel is x / (W - 1) and green y / (H - 1), times 255: the
    pixels of a crop tell where it came from (see crop_extent)."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([np.rint(x * 255 / (width - 1)), np.rint(y * 255 / (height - 1)),
                       np.full_like(x, 128)], axis=-1).astype(np.uint8)
    for name in ("a", "b"):
        folder = root / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(pixels).save(folder / f"g_{i:02d}.png")
    return root


def write_numbered_dataset(root: Path, per_class: int = 12, splits=("train", "val")) -> Path:
    """root/<split>/<class>/n_XX.png, each image one solid colour of its own: whatever crop, flip or
    resize a loader applies, `identities` reads back which file every output image came from."""
    number = 0
    for split in splits:
        for name in COLOURS:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                colour = (40 + 8 * (number % 24), 40 + 8 * (number // 24 % 24), 60)
                Image.new("RGB", SIZES[i % len(SIZES)], colour).save(folder / f"n_{i:02d}.png")
                number += 1
    return root


def everything(loader) -> tuple[list[int], list[torch.Tensor]]:
    """One epoch of a loader: every label, and every batch of images."""
    labels, images = [], []
    for batch, batch_labels in loader:
        labels += batch_labels.tolist()
        images.append(batch)
    return labels, images


def identities(images: torch.Tensor, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) -> list[tuple]:
    """The solid colour of each image of a normalized batch (see write_numbered_dataset)."""
    rgb = images.float().cpu().mean(dim=(2, 3)) * torch.tensor(std) + torch.tensor(mean)
    return [tuple(int(v) for v in row) for row in torch.round(rgb * 255).to(torch.int64).tolist()]


def resumed_on_three_ranks(config: dict, batches_before: int = 2) -> list[tuple]:
    """An epoch of the config's train split begun on 2 ranks (each `batches_before` batches, then
    its state saved) and resumed on 3: the colour of each image the 3 ranks deliver, in the global
    order (a step's rank 0, rank 1, rank 2, then the next step's)."""
    from fastloader import build_loader

    def ranked(rank: int, world: int) -> dict:
        return {**config, "distributed": {"rank": rank, "world_size": world}}
    for rank in range(2):
        batches = iter(loader := build_loader(ranked(rank, 2), "train"))
        for _ in range(batches_before):
            next(batches)
        state = loader.state_dict()
    rest = []
    for rank in range(3):
        loader = build_loader(ranked(rank, 3), "train")
        loader.load_state_dict(state)
        rest.append([colour for images, _ in loader for colour in identities(images)])
    return [rest[r][k] for k in range(len(rest[0])) for r in range(3) if k < len(rest[r])]


def crop_extent(image: torch.Tensor, size=(200, 150), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
    """(area fraction, aspect w / h, flipped) of the source box a gradient image's crop came from."""
    width, height = size
    rgb = image.float() * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)
    red, green = rgb[0].mean(dim=0) * (width - 1), rgb[1].mean(dim=1) * (height - 1)  # per column / row
    box_w = abs(float(red[-1] - red[0])) * len(red) / (len(red) - 1)
    box_h = abs(float(green[-1] - green[0])) * len(green) / (len(green) - 1)
    return box_w * box_h / (width * height), box_w / box_h, bool(red[-1] < red[0])


def base_config(root: Path, **sections) -> dict:
    """A config dict over `root` with small sizes and no workers unless a test asks for them.

    Output on the CPU unless a test asks for `output.device`: tests about pixels, labels and order
    then compare CPU tensors on any machine, with or without a GPU (the GPU path: test_cuda.py)."""
    config = {
        "backend": "torch",
        "seed": 7,
        "dataset": {"root": str(root)},
        "output": {"device": "cpu"},
        "workers": {"num_workers": 0},
        "train": {"batch_size": 4, "transform": {"size": 32}},
        "val": {"batch_size": 4, "transform": {"size": 32}},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a folder on a real file system of that size (tmpfs), to fill; a skip where this
    process may not mount (not root: CI runs as root, where it can)."""
    mounted = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                                  capture_output=True, text=True, timeout=30)
        except FileNotFoundError as error:
            pytest.skip(f"no mount command to make a small file system to fill: {error}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs to fill here ({done.stderr.strip()}); root can, as in CI")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


@pytest.fixture
def solid_root(tmp_path) -> Path:
    return write_solid_dataset(tmp_path / "solid")


@pytest.fixture
def textured_root(tmp_path) -> Path:
    return write_textured_dataset(tmp_path / "textured")


def normalized(colour, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) -> np.ndarray:
    return (np.asarray(colour) / 255.0 - np.asarray(mean)) / np.asarray(std)


skip_without_realphotos = pytest.mark.skipif(
    not REALPHOTOS.is_dir(), reason=f"real photos not present at {REALPHOTOS} (set {PHOTOS_ENV} to their folder)")
REALDATA = [pytest.mark.realdata, skip_without_realphotos]
"""The marks of a test that needs the real photos: selected by `-m realdata`, skipped without them."""


def requires_realphotos(test):
    """Decorator: the test needs the real photos (both marks of REALDATA)."""
    for mark in reversed(REALDATA):
        test = mark(test)
    return test


NATIVE_ABORT = "terminate called without an active exception"
"""How a rank of a gloo job under torchrun dies now and then (SIGABRT): once in a CI run of
test_distributed.py, once in 210 launches of it here. Python's fault handler showed the rank with
no Python frame left: after its loaders had closed, its results were printed and
destroy_process_group() returned, while the interpreter finalized, a C++ thread was destroyed
still joinable (torch's teardown; the torch backend with num_workers 0 starts no thread, and none
of ours holds one); a full suite on 2 cores met it again in test_distributed.py. Its ranks now
leave with os._exit(0) once their results are out, and a launch that still meets the abort is
launched once more; test_example.py (examples/train.py exits as a user's script does) checks what
the run printed as it would. Both keep it as a warning with the ranks' Python stacks
(PYTHONFAULTHANDLER)."""


def env_without(*names: str) -> dict:
    env = dict(os.environ)
    for name in names:
        env.pop(name, None)
    return env


def cpu_only_env(cache_dir, **extra: str) -> dict:
    """The environment of a subprocess that must see the machine a CPU-only user has: no forced
    backend, a temp cache, and no CUDA device even where the machine has one."""
    env = env_without("FASTLOADER_BACKEND")
    env.update(FASTLOADER_CACHE_DIR=str(cache_dir), CUDA_VISIBLE_DEVICES="", **extra)
    return env


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])]
"""output.device values a test runs on: the CPU everywhere, the GPU where there is one."""


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def processes_end(pids, within: float = 10.0) -> bool:
    """Whether these processes have all ended (killed: a zombie not yet reaped counts as ended)
    within `within` seconds."""
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
