"""The embedded demo dataset (`dataset.root: builtin:sample`), generated on first use.

Why generated: the README's run command must work on a fresh machine with no download. The images
are small JPEGs of class-specific shapes and colours on noisy backgrounds, made deterministically,
so a model can learn them and augmentations are visible.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .errors import ConfigError
from .paths import cache_home

log = logging.getLogger("fastloader")

SAMPLE_VERSION = 1
CLASSES = ("circle", "square", "triangle", "stripes", "cross")
COUNTS = {"train": 48, "val": 12}


def builtin_dataset_root(name: str, source: str) -> str:
    """The folder of a builtin dataset, generating it on first use (logged)."""
    if name != "builtin:sample":
        raise ConfigError(f"{source}: dataset.root: unknown builtin dataset {name!r}; the only one is 'builtin:sample'")
    root = cache_home() / f"sample-v{SAMPLE_VERSION}"
    if not (root / "COMPLETE").exists():
        generate_sample(root)
    return str(root)


def generate_sample(root: Path) -> None:
    """Write the demo dataset to `root` atomically: a temporary folder renamed at the end.

    Several ranks may start at once: each writes its own temporary copy, the first rename wins
    and the others discard theirs, so nobody ever reads a half-written dataset.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".sample-", dir=root.parent))
    try:
        rng = np.random.default_rng(SAMPLE_VERSION)
        total = 0
        for split, count in COUNTS.items():
            for label, name in enumerate(CLASSES):
                folder = staging / split / name
                folder.mkdir(parents=True)
                for i in range(count):
                    _draw(name, label, rng).save(folder / f"{name}_{i:03d}.jpg", quality=90)
                    total += 1
        (staging / "COMPLETE").write_text(f"fastloader demo dataset v{SAMPLE_VERSION}\n")
        try:
            os.rename(staging, root)
        except OSError:
            if not (root / "COMPLETE").exists():
                raise
            return  # another process finished first; its copy is identical
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.warning("generated the embedded demo dataset (first use): %d JPEGs in %d classes at %s",
                total, len(CLASSES), root)


def _draw(shape: str, label: int, rng: np.random.Generator) -> Image.Image:
    width, height = int(rng.integers(200, 320)), int(rng.integers(160, 260))
    background = rng.integers(0, 90, size=(height, width, 3), dtype=np.uint8)
    image = Image.fromarray(background)
    draw = ImageDraw.Draw(image)
    hue = np.array([(230, 60, 50), (60, 200, 70), (70, 90, 230), (230, 200, 40), (200, 70, 220)][label])
    colour = tuple(int(c) for c in np.clip(hue + rng.integers(-25, 26, 3), 0, 255))
    cx, cy = width * rng.uniform(0.35, 0.65), height * rng.uniform(0.35, 0.65)
    r = min(width, height) * rng.uniform(0.22, 0.38)
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "square":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    elif shape == "stripes":
        for x in range(0, width, 24):
            draw.rectangle((x, 0, x + 11, height), fill=colour)
    else:
        draw.rectangle((cx - r, cy - r / 4, cx + r, cy + r / 4), fill=colour)
        draw.rectangle((cx - r / 4, cy - r, cx + r / 4, cy + r), fill=colour)
    return image
