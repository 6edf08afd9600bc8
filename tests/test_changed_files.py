"""Files and shards that change after fastloader looked at them: a cached result is kept with the
file's stamp (inode, size, mtime, ctime), so a file replaced or rewritten since, even with its size
and mtime restored (`cp -p`, `touch -d`), is looked at again; a shard rewritten under a running
loader is refused by name, never read at its old offsets with its old labels, and so is a parquet
or Arrow file. Real files, real shards, both backends (CPU)."""
from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import base_config, identities, write_numbered_dataset, write_solid_dataset
from PIL import Image
from shardfiles import pack_folder_split
from tablefiles import folder_rows, table, write_arrow, write_parquet

from fastloader import build_loader
from fastloader.errors import BadImageError

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]


def overwrite_keeping_times(path: Path, data: bytes) -> None:
    """Rewrite the file in place (same inode), then set its mtime back, as `cp -p` or a careful
    re-pack would: only its ctime says it changed."""
    before = os.stat(path)
    with open(path, "r+b") as handle:
        handle.write(data)
        handle.truncate()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


# ---------------------------------------------------------------------------------------------
# The screening cache
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_rewritten_after_screening_with_its_size_and_mtime_kept_is_screened_again(tmp_path, backend):
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    victim = root / "val" / "b_green" / "img_01.png"
    config = base_config(root, backend=backend)
    assert build_loader(config, "val").bad_samples == []  # screened, and cached
    page = b"<html><body>not found</body></html>"
    overwrite_keeping_times(victim, page.ljust(victim.stat().st_size, b" "))
    loader = build_loader(config, "val")
    assert loader.bad_samples == [(str(victim), "not an image: an HTML or XML page")]
    assert sorted(label for _, labels in loader for label in labels.tolist()) == [0, 0, 1, 2, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_replaced_by_a_tiny_image_after_screening_gets_its_new_size(tmp_path, backend, caplog):
    """The DALI backend draws eval boxes from the screened sizes: a stale size is a box out of the
    image (it warned, and corrected the size, only after the batch had been decoded)."""
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    victim = root / "val" / "a_red" / "img_00.png"
    config = base_config(root, backend=backend)
    build_loader(config, "val")
    replacement = tmp_path / "tiny.png"
    Image.new("RGB", (3, 2), (200, 30, 40)).save(replacement)
    os.replace(replacement, victim)
    caplog.set_level(logging.INFO, logger="fastloader")
    loader = build_loader(config, "val")
    assert "screened 1 file of" in caplog.text and "again, changed since they were screened" in caplog.text
    assert sorted(label for _, labels in loader for label in labels.tolist()) == [0, 0, 1, 1, 2, 2]
    assert "changed since it was screened" not in caplog.text and loader.bad_samples == []


def test_an_unchanged_dataset_is_not_screened_again(tmp_path, caplog):
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    build_loader(base_config(root), "val")
    caplog.set_level(logging.INFO, logger="fastloader")
    build_loader(base_config(root), "val")
    assert "screened" not in caplog.text


# ---------------------------------------------------------------------------------------------
# Tar shards
# ---------------------------------------------------------------------------------------------


def two_shards(tmp_path: Path) -> tuple[Path, list[Path]]:
    """18 numbered images in two shards of 9 of the same byte size (class 0 x6 + class 1 x3; class 1
    x3 + class 2 x6), so that one copied over the other keeps the size."""
    root = write_numbered_dataset(tmp_path / "data", per_class=6, splits=("val",))
    shards = pack_folder_split(root / "val", tmp_path / "shards", "val", per_shard=9)
    assert len(shards) == 2 and shards[0].stat().st_size == shards[1].stat().st_size
    return root, shards


def shard_config(shards: list[Path], backend: str) -> dict:
    config = base_config("unused", backend=backend)
    config["dataset"] = {"format": "webdataset"}
    config["val"] = {**config["val"], "shards": [str(path) for path in shards]}
    return config


def pairs(loader) -> list[tuple[tuple, int]]:
    """(the image's own colour, its label) of every sample of an epoch: which file, and what label."""
    return [pair for images, labels in loader for pair in zip(identities(images), labels.tolist())]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shard_copied_over_with_cp_p_and_its_mtime_restored_gets_the_right_labels(tmp_path, backend):
    _, shards = two_shards(tmp_path)
    config = shard_config(shards, backend)
    truth = dict(pairs(build_loader(config, "val")))  # indexes both shards, and caches the index
    assert sorted(truth.values()) == [0] * 6 + [1] * 6 + [2] * 6
    overwrite_keeping_times(shards[0], shards[1].read_bytes())  # cp -p val-000001.tar val-000000.tar
    loader = build_loader(config, "val")
    delivered = pairs(loader)
    assert loader.bad_samples == [] and len(delivered) == 18
    assert all(truth[colour] == label for colour, label in delivered)
    assert sorted(label for _, label in delivered) == [1] * 6 + [2] * 12  # shard 1's samples, twice


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shard_overwritten_during_a_run_is_refused_by_name_never_mislabelled(tmp_path, backend):
    _, shards = two_shards(tmp_path)
    loader = build_loader(shard_config(shards, backend), "val")
    truth = dict(pairs(loader))
    with open(shards[0], "r+b") as handle:  # in place: the descriptor the loader holds reads the new bytes
        handle.write(shards[1].read_bytes())
    delivered = pairs(loader)
    assert all(truth[colour] == label for colour, label in delivered)
    assert sorted(label for _, label in delivered) == [1] * 3 + [2] * 6  # shard 1's own samples
    assert len(loader.bad_samples) == 9
    for name, reason in loader.bad_samples:
        assert name.startswith(f"{shards[0]}:") and f"the shard {shards[0]} changed since it was indexed" in reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shard_replaced_before_it_is_opened_is_refused_or_read_as_indexed(tmp_path, backend):
    """Replaced by rename after indexing: a descriptor opened before (the torch backend opens the
    shards when it is built, for its workers) still reads the indexed file; one opened after (the
    DALI backend's, unscreened) finds another inode, and the shard's members are refused by name."""
    _, shards = two_shards(tmp_path)
    truth = dict(pairs(build_loader(shard_config(shards, "torch"), "val")))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    moved = [Path(shutil.copy(path, fresh / path.name)) for path in shards]
    config = shard_config(moved, backend)
    config["dataset"]["screen"] = False  # screening would read the shards now
    loader = build_loader(config, "val")
    shutil.copy(moved[1], tmp_path / "copy.tar")
    os.replace(tmp_path / "copy.tar", moved[0])
    delivered = pairs(loader)
    assert all(truth[colour] == label for colour, label in delivered)
    refused = 0 if backend == "torch" else 9
    assert len(delivered) == 18 - refused and len(loader.bad_samples) == refused
    for name, reason in loader.bad_samples:
        assert name.startswith(f"{moved[0]}:") and f"the shard {moved[0]} changed since it was indexed (inode" in reason


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["parquet", "compressed parquet", "arrow"])
def test_a_table_rewritten_in_place_during_a_run_is_refused_by_name_never_mislabelled(tmp_path, backend, fmt):
    """A parquet or Arrow file rewritten under a running loader with its rows reversed (a new export of
    the same images: the same size, every row's bytes at the same offsets as another's) and its mtime
    restored (`cp -p`). Its rows were read at the indexed offsets under the indexed labels: every
    image under another image's label, silently. Now its rows are refused by name; a new loader reads
    the new file right. Compressed pages are read by row group, kept decoded by the reading process:
    those are refused as well, as a fresh reader (another backend, a new worker) would refuse them."""
    root = write_numbered_dataset(tmp_path / "data", per_class=4, splits=("val",))
    classes, images, labels = folder_rows(root / "val")
    order = [0, 4, 8, 1, 5, 9, 10, 6, 2, 11, 7, 3]  # labels 0 1 2 0 1 2 2 1 0 2 1 0: the same reversed
    rows = [(images[i], labels[i]) for i in order]
    compressed = {"compression": "zstd", "column_encoding": None, "use_dictionary": False}
    write = {"parquet": write_parquet, "arrow": write_arrow,
             "compressed parquet": lambda *a: write_parquet(*a, row_group_size=4, **compressed)}[fmt]
    by_row_group, fmt = fmt.startswith("compressed"), fmt.split()[-1]
    path = write(tmp_path / f"val.{fmt}", table(*zip(*rows), classes))
    again = write(tmp_path / f"reversed.{fmt}", table(*zip(*rows[::-1]), classes))
    assert path.read_bytes() != again.read_bytes()
    assert by_row_group or path.stat().st_size == again.stat().st_size  # each row's bytes where another's were
    config = base_config("unused", backend=backend)
    config["dataset"] = {"format": fmt}
    config["val"] = {**config["val"], "files": str(path)}
    loader = build_loader(config, "val")
    truth = dict(pairs(loader))
    assert sorted(truth.values()) == [0] * 4 + [1] * 4 + [2] * 4
    overwrite_keeping_times(path, again.read_bytes())
    with pytest.raises(BadImageError, match=f"no sample could be read .* the file {re.escape(str(path))} changed "
                                            f"since it was indexed"):
        pairs(loader)  # every row refused: the epoch is an error, not empty batches
    assert len(loader.bad_samples) == 12
    for name, reason in loader.bad_samples:
        assert name.startswith(f"{path}:") and f"the file {path} changed since it was indexed" in reason
    fresh = pairs(build_loader(config, "val"))
    assert len(fresh) == 12 and all(truth[colour] == label for colour, label in fresh)
