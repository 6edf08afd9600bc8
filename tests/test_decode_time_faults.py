"""Files that go bad after the loader was built (or were never screened), on both backends, CPU:
nothing reaches DALI's decoders unchecked (no crash), every rank yields len(loader) batches whatever
fails at decode time, a resume after such a batch neither repeats nor loses one, and each bad file
is warned about once, not every epoch (docs/bad-input.md, docs/semantics.md)."""
from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, base_config, identities, write_numbered_dataset
from oddfiles import ODD_FILES, running_as_root, write_odd_files
from PIL import Image

from fastloader import build_loader
from fastloader.decoding.screen import read_screened, screen_file

BACKENDS = ["torch", "dali"]
SPLITS = ["train", "val"]
HTML = b"<!DOCTYPE html><html><head><title>404 Not Found</title></head><body>Not Found</body></html>\n" * 8
LOSSLESS = next(odd for odd in ODD_FILES if odd.name == "lossless.JPEG")
"""A JPEG whose header passes every check and whose data no decoder reads (DALI fails the batch)."""


def run_isolated(script: str, *args: str) -> dict:
    """Run `script` in a fresh interpreter (a crash of a native decoder must fail this test, not end
    the test run) and return the JSON object it prints last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def noise_jpegs(folder: Path, count: int, side: int = 64) -> list[Path]:
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{i:03d}.JPEG" for i in range(count)]
    for path in paths:
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(path, quality=90)
    return paths


def epoch_of(loader) -> list[list[tuple]]:
    """Each batch of one epoch as the identities of its images (see write_numbered_dataset)."""
    return [identities(images) for images, _ in loader]


def planned_files(loader, batch: int, epoch: int = 0) -> list[Path]:
    return [Path(loader.index.path(int(i))) for i in loader.order.batches(epoch)[batch][:, 0]]


def bomb_jpeg(width: int = 20000, height: int = 20000) -> bytes:
    """A tiny JPEG whose frame header claims width x height pixels."""
    import io
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 90, 90)).save(buffer, format="JPEG", quality=50)
    data = bytearray(buffer.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


# -- item 1: nothing reaches DALI's decoders unchecked ----------------------------------------------

UNSCREENED = """
    import json, sys
    from fastloader import build_loader
    root, backend = sys.argv[1], sys.argv[2]
    result = {}
    for split, batch in (("val", 32), ("train", 64)):
        config = {"backend": backend, "seed": 3, "dataset": {"root": root, "screen": False},
                  "output": {"device": "cpu"}, "workers": {"num_workers": 2}, "dali": {"threads": 2},
                  split: {"batch_size": batch, "transform": {"size": 32}}}
        with build_loader(config, split) as loader:
            sizes = [[len(labels) for _, labels in loader] for epoch in range(2)]
            result[split] = {"sizes": sizes, "bad": loader.bad_samples, "batches": len(loader)}
    print(json.dumps(result))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_non_image_in_an_unscreened_folder_is_named_and_never_reaches_a_decoder(tmp_path, backend):
    """dataset.screen: false, an HTML page named .JPEG among 64 JPEGs: DALI 2.4's CPU decoder crashed
    on such a batch (exit 139). The feed checks the bytes it feeds: the page is skipped and named, a
    train slot refilled, an eval batch one short."""
    root = tmp_path / "data"
    for split in SPLITS:
        html = noise_jpegs(root / split / "c0", 64)[5]
        html.write_bytes(HTML)
    result = run_isolated(UNSCREENED, str(root), backend)
    for split in SPLITS:
        assert [Path(path).name for path, _ in result[split]["bad"]] == ["005.JPEG"], split
        if backend == "dali":  # the feed's header check; torch: its decoder's words
            assert result[split]["bad"][0][1] == "not an image: an HTML or XML page"
    assert result["val"]["sizes"] == [[31, 32]] * 2
    assert result["train"]["sizes"] == [[64]] * 2 and result["train"]["batches"] == 1


TINY = """
    import json, os, sys
    import torch
    from PIL import Image
    from fastloader import build_loader
    root, backend, split = sys.argv[1], sys.argv[2], sys.argv[3]
    config = {"backend": backend, "seed": 3, "dataset": {"root": root}, "output": {"device": "cpu"},
              "workers": {"num_workers": 2}, "dali": {"threads": 2},
              split: {"batch_size": 8, "transform": {"size": 32}}}
    with build_loader(config, split) as loader:  # screened: every file 64 x 64
        epochs = []
        for epoch in range(2):
            colours = []
            for number, (images, _) in enumerate(loader):
                if epoch == 0 and number == 0:  # at a batch boundary, every file becomes 3x2 or 1x1
                    for sample in range(len(loader.index)):  # replaced whole, as a copy or a sync does
                        path = loader.index.path(sample)
                        size = (3, 2) if sample % 2 else (1, 1)
                        Image.new("RGB", size, (200, 30, 40)).save(path + ".new", format="JPEG", quality=95)
                        os.replace(path + ".new", path)
                rgb = images.float().mean(dim=(2, 3)) * torch.tensor([0.229, 0.224, 0.225]) + \\
                    torch.tensor([0.485, 0.456, 0.406])
                colours += (rgb * 255).round().int().tolist()
            epochs.append(colours)
    print(json.dumps({"epochs": epochs, "bad": loader.bad_samples}))
"""


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_files_replaced_by_tiny_images_after_screening_get_boxes_for_their_size(tmp_path, backend, split):
    """Every file rewritten as a 3x2 or 1x1 image after the first batch: the DALI eval pipeline
    crashed on a centre box of the screened size (exit 139). The feed reads each file's size from
    the bytes it feeds, so every box fits: the whole epoch comes out, in the new colour."""
    root = tmp_path / "data"
    noise_jpegs(root / split / "c0", 64)  # more batches than the loaders prepare ahead
    result = run_isolated(TINY, str(root), backend, split)
    assert result["bad"] == []
    first, second = result["epochs"]  # the first epoch's batches fed before the change keep the old pixels
    assert len(first) == len(second) == 64
    assert all(np.abs(np.array(colour) - (200, 30, 40)).max() <= 8 for colour in first[-8:] + second), second


def test_the_feeds_check_of_bytes_in_memory_agrees_with_screening_on_every_odd_file(tmp_path):
    """read_screened (the DALI feed's check of the bytes it feeds) and screen_file (screening) give
    each odd file the same format, size, turn and problem; a bomb too big for Pillow to open is
    measured from its markers by the first (its size and dataset.max_pixels in the reason)."""
    written = write_odd_files(tmp_path)
    for name in written:
        if name == "unreadable.JPEG" and running_as_root():
            continue
        path = str(tmp_path / name)
        data, screened = read_screened(path)
        assert (data is None) == (name == "unreadable.JPEG"), name
        if name == "bomb.JPEG":
            assert screened.problem == "decompression bomb: 65535x65535 = 4,294,836,225 pixels, above " \
                                       "dataset.max_pixels (178,956,970)"
            assert screen_file(path).problem.startswith("decompression bomb: 4,294,836,225 pixels")
            continue
        assert screened == screen_file(path), name


# -- item 8: a decompression bomb written after screening ------------------------------------------

@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bomb_written_over_a_screened_file_is_refused_from_its_header(tmp_path, backend, split):
    """A 600-byte JPEG claiming 20000 x 20000 pixels over a screened file: the torch backend refuses
    it at decode, the DALI feed from the header of the bytes it would feed (DALI decoded it: +2 GB)."""
    root = tmp_path / "data"
    paths = noise_jpegs(root / split / "c0", 8)
    loader = build_loader(base_config(root, backend=backend), split)
    bomb = bomb_jpeg()
    assert len(bomb) < 700
    paths[3].write_bytes(bomb)
    sizes = [len(labels) for _, labels in loader]
    assert sizes == ([4, 4] if split == "train" else [3, 4])  # train: the slot refilled
    [(path, reason)] = loader.bad_samples
    assert path == str(paths[3])
    assert reason == ("decompression bomb: 20000x20000 = 400,000,000 pixels, above dataset.max_pixels (178,956,970)"
                      if backend == "dali" else "DecompressionBombError: Image size (400000000 pixels) exceeds limit "
                      "of 178956970 pixels, could be decompression bomb DOS attack.")


# -- items 4 and 5: equal batches on every rank, and an exact resume, whatever fails at decode time -

def ranks_epoch(root: Path, backend: str, split: str, world: int = 3) -> list[list[list[tuple]]]:
    """Each rank's batches of epoch 0 (identities), one loader per rank, as a job of `world` ranks."""
    out = []
    for rank in range(world):
        config = base_config(root, backend=backend, distributed={"rank": rank, "world_size": world},
                             train={"shuffle": False}, dali={"threads": 2})
        with build_loader(config, split) as loader:
            batches = epoch_of(loader)
            assert len(batches) == len(loader), (backend, split, rank)
            out.append(batches)
    return out


@pytest.mark.parametrize("split", SPLITS)
def test_a_whole_batch_undecodable_at_decode_time_keeps_every_rank_in_step(tmp_path, split):
    """3 ranks, batch 4: the four files of rank 1's first batch pass screening but no decoder reads
    them. That rank yielded one batch fewer than the others (24 vs 25 in the report: DDP's all_reduce
    hung). Now every rank yields len(loader) batches on both backends: in train mode each slot is
    refilled with a substitute drawn from its seed, the same on both backends; in eval mode the batch
    comes out empty."""
    root = write_numbered_dataset(tmp_path / "data", per_class=12, splits=(split,))
    files = sorted((root / split / "a_red").glob("*.png"))
    broken = [files[i] for i in (1, 4, 7, 10)]  # positions 1, 4, 7, 10: rank 1's first batch of 4
    for path in broken:
        LOSSLESS.write(path)
    by_backend = {backend: ranks_epoch(root, backend, split) for backend in BACKENDS}
    assert by_backend["torch"] == by_backend["dali"]
    ranks = by_backend["dali"]
    assert [len(batches) for batches in ranks] == [3, 3, 3]
    sizes = [[len(batch) for batch in batches] for batches in ranks]
    assert sizes == ([[4, 4, 4]] * 3 if split == "train" else [[4, 4, 4], [0, 4, 4], [4, 4, 4]])
    if split == "val":  # every decodable sample exactly once
        assert len({colour for batches in ranks for batch in batches for colour in batch}) == 32


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resume_after_a_batch_whose_files_all_fail_repeats_nothing(tmp_path, backend, split, caplog):
    """The files of planned batch 1 become HTML pages after screening. The position counted the
    batches delivered, so a batch dropped at decode time made state_dict() point 4 samples early and
    the resumed run delivered a batch twice. Now every planned batch is yielded (refilled, or empty
    and logged, on both backends) and the position counts planned batches."""
    root = write_numbered_dataset(tmp_path / "data", per_class=8, splits=(split,))  # 24 samples, 6 batches
    config = base_config(root, backend=backend, dali={"threads": 2})
    whole, interrupted, resumed = (build_loader(config, split) for _ in range(3))  # all screened before
    for path in planned_files(whole, 1):
        path.write_bytes(HTML)
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        reference = epoch_of(whole)
    assert len(reference) == len(whole) == 6
    assert [len(batch) for batch in reference] == ([4] * 6 if split == "train" else [4, 0, 4, 4, 4, 4])
    if split == "val":
        assert f"{backend} loader, split 'val', epoch 0, rank 0: a batch of 4 samples comes out empty" in caplog.text
    consumed = []
    for number, (images, _) in enumerate(interrupted):
        consumed.append(identities(images))
        if number == 2:
            break
    state = interrupted.state_dict()
    assert state["position"] == 12
    resumed.load_state_dict(state)
    assert consumed + epoch_of(resumed) == reference


# -- item 18: a bad file is warned about once, not every epoch -------------------------------------

@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bad_file_is_warned_about_once_over_several_epochs(tmp_path, backend, split, caplog):
    """The epoch summary was a WARNING every epoch (7 in a 1 s bench); docs/bad-input.md says later
    epochs skip the file quietly. Four epochs: one warning naming the file, one summary."""
    root = tmp_path / "data"
    paths = noise_jpegs(root / split / "c0", 8, side=32)
    loader = build_loader(base_config(root, backend=backend), split)
    paths[2].write_bytes(HTML)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="fastloader"):
        sizes = [sum(len(labels) for _, labels in loader) for _ in range(4)]
    assert sizes == [8 if split == "train" else 7] * 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in warnings if m.startswith(f"skipped {paths[2]}: ")]) == 1, warnings
    summaries = [r for r in caplog.records if "files that cannot be decoded: 1" in r.getMessage()]
    assert [r.levelno for r in summaries] == [logging.WARNING] + [logging.DEBUG] * 3, warnings
    assert len(warnings) == 2, warnings
