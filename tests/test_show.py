"""`fastloader show` as a user runs it: a real PNG is written, and its pixels are checked (the demo's
run in a real subprocess, the rest in this process on the CPU).

The solid-colour dataset gives pixel truth: whatever the backend, dtype or memory format, the centre of
each tile must come back as its class colour, which only holds if de-normalization is right.
"""
from __future__ import annotations

import importlib.util
import logging
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import COLOURS, REPO, cpu_only_env, write_solid_dataset
from PIL import Image

from fastloader.commands.show import CAPTION_HEIGHT, HEADER_HEIGHT, PAD

FASTLOADER = [sys.executable, "-m", "fastloader.cli"]


def run(*args, cache_dir) -> subprocess.CompletedProcess:
    """The command as a user on a CPU-only machine runs it (the GPU path: test_cuda.py)."""
    environment = cpu_only_env(cache_dir)
    return subprocess.run([*FASTLOADER, *args], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=240)


def show_here(capsys, *args) -> subprocess.CompletedProcess:
    """The command in this process, its loader on the CPU (`output.device=cpu`: what a machine's GPU
    does is test_cuda.py's), with its exit code and what it printed; the real-process run is the
    demo's test."""
    from fastloader.cli import main
    code = main([*args, "--set", "output.device=cpu"])
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(["fastloader", *args], code, printed.out, printed.err)


def dali_missing() -> bool:
    try:
        return importlib.util.find_spec("nvidia.dali") is None
    except ModuleNotFoundError:  # no `nvidia` namespace at all
        return True


def expected_layout(n: int, tile: int) -> tuple[int, int, int]:
    """(columns, width, height) of the PNG for n square tiles, written out from the layout's rules."""
    columns = math.ceil(math.sqrt(n))
    rows = math.ceil(n / columns)
    return columns, PAD + columns * (tile + PAD), HEADER_HEIGHT + rows * (tile + CAPTION_HEIGHT + PAD)


def tile_box(i: int, columns: int, tile: int) -> tuple[int, int]:
    """Top-left (x, y) of tile i."""
    row, column = divmod(i, columns)
    return PAD + column * (tile + PAD), HEADER_HEIGHT + row * (tile + CAPTION_HEIGHT + PAD)


def dark_pixels(region: np.ndarray) -> int:
    """Text is drawn near-black on white; count pixels dark in every channel."""
    return int((region < 90).all(axis=-1).sum())


def test_show_writes_a_captioned_grid_of_the_demo_dataset(tmp_path):
    out = tmp_path / "tmp" / "grid.png"  # the parent folder does not exist yet
    result = run("show", "configs/sample.yaml", "--out", str(out), "--n", "8", cache_dir=tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    assert out.is_file()
    assert f"wrote {out}: 8 samples of split 'train' (backend torch), 3x3 tiles of 128x128 px" in result.stdout
    pixels = np.asarray(Image.open(out).convert("RGB"))
    columns, width, height = expected_layout(8, 128)  # demo images at transform.size 128: no scaling
    assert pixels.shape == (height, width, 3)
    tiles = pixels[HEADER_HEIGHT:]
    assert tiles.std() > 30 and len(np.unique(tiles.reshape(-1, 3), axis=0)) > 1000  # images, not a blank
    assert dark_pixels(pixels[:HEADER_HEIGHT]) > 50  # the header line
    x, y = tile_box(0, columns, 128)
    assert dark_pixels(pixels[y + 128:y + 128 + CAPTION_HEIGHT, x:x + 128]) > 10  # the first caption
    assert (pixels[-PAD:, :] == 255).all()  # white margin under the last row: nothing drawn off the layout

    other = tmp_path / "other.png"  # another seed and epoch: another draw of crops and order
    again = run("show", "configs/sample.yaml", "--out", str(other), "--n", "8", "--seed", "3", "--epoch", "1",
                "--backend", "torch", cache_dir=tmp_path / "cache")
    assert again.returncode == 0, again.stderr
    assert "backend: torch (from the command's --backend torch)" in again.stderr  # not "from configs/sample.yaml"
    other_pixels = np.asarray(Image.open(other).convert("RGB"))
    assert other_pixels.shape == pixels.shape
    assert not np.array_equal(other_pixels[HEADER_HEIGHT:], tiles)


@pytest.mark.parametrize("options, backend", [
    pytest.param([], "torch", id="torch"),
    pytest.param(["--set", "backend=dali"], "dali", id="dali-cpu",
                 marks=pytest.mark.skipif(dali_missing(), reason="NVIDIA DALI does not import here")),
    pytest.param(["--set", "output.dtype=bfloat16", "--set", "output.channels_last=true"], "torch",
                 id="bfloat16-channels-last"),
])
def test_tiles_show_the_class_colours_in_the_loaders_order(tmp_path, options, backend, capsys):
    root = write_solid_dataset(tmp_path / "solid", per_class=5, splits=("val",))
    config = tmp_path / "solid.yaml"
    config.write_text(f"backend: torch\nseed: 0\ndataset:\n  root: {root}\nworkers:\n  num_workers: 0\n"
                      f"val:\n  batch_size: 4\n  transform:\n    size: 32\n")
    out = tmp_path / "grid.png"
    result = show_here(capsys, "show", str(config), "--out", str(out), "--split", "val", "--n", "20", *options)
    assert result.returncode == 0, result.stderr
    # 15 images in the split, fewer than --n: all are shown and the user is told
    assert "split 'val' yields 15 samples in epoch 0 (15 in the split), fewer than --n 20" in result.stdout
    assert f"15 samples of split 'val' (backend {backend})" in result.stdout
    assert "4x4 tiles of 128x128 px" in result.stdout
    pixels = np.asarray(Image.open(out).convert("RGB")).astype(int)
    columns, width, height = expected_layout(15, 128)  # 32 px images are scaled x4 so captions fit
    assert pixels.shape == (height, width, 3)
    # eval mode reads in index order: classes sorted, a_red then b_green then c_blue, 5 each
    expected = [colour for colour in COLOURS.values() for _ in range(5)]
    for i, colour in enumerate(expected):
        x, y = tile_box(i, columns, 128)
        centre = pixels[y + 64, x + 64]
        assert np.abs(centre - np.asarray(colour)).max() <= 2, (i, centre.tolist(), colour)
        assert dark_pixels(pixels[y + 128:y + 128 + CAPTION_HEIGHT, x:x + 128].astype(np.uint8)) > 10


def test_an_unknown_split_exits_2_naming_it_without_a_traceback(tmp_path, capsys):
    result = show_here(capsys, "show", "configs/sample.yaml", "--out", str(tmp_path / "grid.png"), "--split", "nope")
    assert result.returncode == 2
    assert "fastloader: error:" in result.stderr and "no split 'nope'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "grid.png").exists()


def test_show_ops_captions_each_tile_with_the_ops_its_seed_drew(tmp_path, capsys, caplog):
    """--ops: a second band under each tile names its flips and ops, the ones the loader drew from
    the sample's seed (fastloader.draws); the grid grows by two caption lines per row."""
    caplog.set_level(logging.INFO, logger="fastloader")
    out = tmp_path / "ops.png"
    result = show_here(capsys, "show", "configs/sample.yaml", "--out", str(out), "--n", "4", "--ops",
                 "--set", "train.transform.auto_augment=rand-m9-n3-mstd0.5-p1", "--set", "train.transform.size=96")
    assert result.returncode == 0, result.stderr
    pixels = np.asarray(Image.open(out).convert("RGB"))
    rows_height = 2 * (96 + 3 * CAPTION_HEIGHT + PAD)
    assert pixels.shape[0] == HEADER_HEIGHT + rows_height
    for i in range(4):
        row, column = divmod(i, 2)
        x, y = PAD + column * (96 + PAD), HEADER_HEIGHT + row * (96 + 3 * CAPTION_HEIGHT + PAD)
        ops_band = pixels[y + 96 + CAPTION_HEIGHT:y + 96 + 3 * CAPTION_HEIGHT, x:x + 96]
        assert dark_pixels(ops_band) > 20, i  # three ops at p 1: every tile has some
    assert "auto_augment='rand-m9-n3-mstd0.5-p1'" in caplog.text  # the loader's repr in its log line


def test_mixed_samples_are_captioned_with_their_two_largest_soft_labels(tmp_path, capsys):
    """Mixup and cutmix of solid colours: tiles hold blends or pasted boxes, and each tile's caption has
    two lines, "class: weight" for its two largest target weights (the CPU, as a user without a GPU)."""
    root = write_solid_dataset(tmp_path / "solid", per_class=4, splits=("train",))
    out = tmp_path / "mixed.png"
    keys = {"dataset.root": root, "train.batch_size": 9, "train.transform.size": 32, "train.label_smoothing": 0.1,
            "train.mixup": "{mixup_alpha: 1.0, cutmix_alpha: 1.0, mode: elem}"}
    result = show_here(capsys, "show", "configs/sample.yaml", "--out", str(out), "--n", "9",
                 *(f"--set={key}={value}" for key, value in keys.items()))
    assert result.returncode == 0, result.stderr
    assert "9 samples of split 'train' (backend torch), 3x3 tiles of 128x128 px, captioned with their soft " \
           "targets' top-2 classes" in result.stdout
    pixels = np.asarray(Image.open(out).convert("RGB")).astype(int)
    columns, rows, tile = 3, 3, 128
    assert pixels.shape[0] == HEADER_HEIGHT + rows * (tile + 2 * CAPTION_HEIGHT + PAD)  # two caption lines
    colours = np.asarray(list(COLOURS.values()))
    blended = 0
    for i in range(9):
        row, column = divmod(i, columns)
        x, y = PAD + column * (tile + PAD), HEADER_HEIGHT + row * (tile + 2 * CAPTION_HEIGHT + PAD)
        for line in range(2):
            band = pixels[y + tile + line * CAPTION_HEIGHT:y + tile + (line + 1) * CAPTION_HEIGHT, x:x + tile]
            assert dark_pixels(band.astype(np.uint8)) > 10, (i, line)
        tile_pixels = np.unique(pixels[y:y + tile, x:x + tile].reshape(-1, 3), axis=0)
        off_class = [p for p in tile_pixels if np.abs(colours - p).max(axis=1).min() > 2]
        blended += len(tile_pixels) > 1 or bool(off_class)  # a pasted box, or a blend of two colours
    assert blended >= 3


def test_show_draws_every_view_of_each_sample_in_a_row(tmp_path, capsys):
    """train.views: a row per sample, its views in order (a 16 px local view scaled to the 32 px
    global's tile), each tile the sample's class colour (solid images: every crop is that colour)."""
    root = write_solid_dataset(tmp_path / "solid", per_class=4, splits=("train",))
    config = tmp_path / "views.yaml"
    config.write_text(f"backend: torch\nseed: 0\ndataset:\n  root: {root}\nworkers:\n  num_workers: 0\n"
                      f"train:\n  batch_size: 4\n  views:\n    - {{name: global, count: 2, size: 32}}\n"
                      f"    - {{name: local, count: 3, size: 16, scale: [0.05, 0.4]}}\n")
    out = tmp_path / "views.png"
    result = show_here(capsys, "show", str(config), "--out", str(out), "--n", "3", "--ops")
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and "3 samples x 5 views of split 'train' (backend torch), 5x3 tiles of " \
                                      "128x128 px" in result.stdout
    pixels = np.asarray(Image.open(out).convert("RGB")).astype(int)
    lines = 1 + 2  # the caption, then two lines of ops (--ops)
    for row in range(3):
        y = HEADER_HEIGHT + row * (128 + CAPTION_HEIGHT * lines + PAD)
        centres = [pixels[y + 64, PAD + column * (128 + PAD) + 64] for column in range(5)]
        assert any(np.abs(centres[0] - np.asarray(c)).max() <= 2 for c in COLOURS.values()), centres[0]
        assert all(np.abs(centre - centres[0]).max() <= 2 for centre in centres)  # one sample's views, one colour
