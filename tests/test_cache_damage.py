"""A damaged uint8 cache is refused when it is opened, naming its folder and the `fastloader cache`
command that rebuilds it (with the user's overrides): a pixel file cut short, rows or images moved,
a manifest that is not what the build wrote, a cache of an older format. Never a skip that blames
the source images, a raw numpy or JSON error mid-epoch, or wrong pixels. Real caches, built by
the writer and then damaged as a copy or an editor would; both backends (CPU)."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import identities, write_numbered_dataset

from fastloader import build_loader, load_config
from fastloader.cache_write import build_split_cache
from fastloader.errors import CacheError
from fastloader.sources.formats import build_index

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]
SHORT = 40


@pytest.fixture
def built(tmp_path) -> tuple[Path, Path]:
    """A YAML config over a numbered dataset (every image its own colour), and the train split's cache."""
    root = write_numbered_dataset(tmp_path / "data", per_class=4, splits=("train",))
    cache = tmp_path / "cache"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"dataset": {"root": str(root), "cache": str(cache)}, "output": {"device": "cpu"},
                                    "workers": {"num_workers": 0}, "seed": 3,
                                    "train": {"batch_size": 4, "transform": {"size": 32}}}))
    config = load_config(path)
    split = config.split("train")
    build_split_cache(config, split, build_index(config, split), str(cache), SHORT, workers=0)
    return path, cache / "train"


def refusal(path: Path, backend: str, overrides=(), short_side: int | None = SHORT) -> str:
    """The error's message, checked for the folder and the command (--short-side as built, where
    the manifest still says it)."""
    with pytest.raises(CacheError) as error:
        build_loader(path, "train", [f"backend={backend}", *overrides])
    message = str(error.value)
    assert f"the cache {path.parent / 'cache' / 'train'} is damaged" in message or "version" in message, message
    side = f" --short-side {short_side}" if short_side else ""
    command = f"fastloader cache {path} --split train{side} --out {path.parent / 'cache'} --set backend={backend}"
    assert f"Rebuild it with `{command}" in message, message
    return message


def edit_manifest(folder: Path, change) -> None:
    manifest = folder / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(change(data)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pixel_file_cut_short_is_refused_before_any_batch(built, backend):
    path, folder = built
    pixels = folder / "pixels.u8"
    whole = pixels.stat().st_size
    with open(pixels, "r+b") as handle:
        handle.truncate(whole // 2)
    message = refusal(path, backend)
    assert f"pixels.u8 holds {whole // 2:,} bytes, its index says {whole:,}" in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_of_the_file_table_moved_are_refused(built, backend):
    path, folder = built
    with np.load(folder / "files.npz") as npz:
        arrays = dict(npz)
    arrays["rows"] = arrays["rows"][::-1].copy()  # every file now points at another image
    np.savez(folder / "files.npz", **arrays)
    assert "the checksum of its index arrays is not the one the build wrote" in refusal(path, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_images_swapped_in_the_pixel_file_are_refused(built, backend):
    path, folder = built
    offsets, shapes = np.load(folder / "offsets.npy"), np.load(folder / "shapes.npy")
    first, other = 0, next(r for r in range(1, len(shapes)) if (shapes[r] == shapes[0]).all())
    data = bytearray((folder / "pixels.u8").read_bytes())
    a, b = slice(offsets[first], offsets[first + 1]), slice(offsets[other], offsets[other + 1])
    data[a], data[b] = data[b], data[a]
    (folder / "pixels.u8").write_bytes(bytes(data))
    assert "the checksum of sampled images in pixels.u8" in refusal(path, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("damage, words, known_side", [
    (lambda data: [data], "manifest.json is a JSON list, not an object", False),
    (lambda data: {k: v for k, v in data.items() if k != "classes"}, "manifest.json has classes: null", True),
    (lambda data: {**data, "short_side": "big"}, 'manifest.json has short_side: "big", expected a count', False),
    (lambda data: {**data, "images": data["images"] + 1}, "offsets.npy is int64 [13], expected int64 [14]", True),
    (lambda data: {**data, "bad": {"x": 1}}, "manifest.json has bad: {", True),
], ids=["list", "no-classes", "short-side-text", "images-count", "bad-not-a-list"])
def test_a_manifest_that_is_not_what_the_build_wrote_is_refused(built, backend, damage, words, known_side):
    path, folder = built
    edit_manifest(folder, damage)
    assert words in refusal(path, backend, short_side=SHORT if known_side else None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_of_the_older_format_says_to_rebuild_it(built, backend):
    path, folder = built
    edit_manifest(folder, lambda data: {k: v for k, v in {**data, "version": 1}.items() if k != "checksums"})
    assert "it is fastloader-cache version 1, this fastloader reads fastloader-cache version 2" in \
        refusal(path, backend)


def test_the_rebuild_command_keeps_the_users_overrides(built):
    path, folder = built
    (folder / "pixels.u8").write_bytes(b"")
    overrides = ["dataset.max_pixels=1000000", "train.transform.scale=[0.5, 1.0]", "dataset.on_bad_image=raise"]
    with pytest.raises(CacheError) as error:
        build_loader(path, "train", overrides)
    words = shlex.split(str(error.value).split("Rebuild it with `")[1].rstrip("`"))
    assert words[:7] == ["fastloader", "cache", str(path), "--split", "train", "--short-side", str(SHORT)]
    assert [words[i + 1] for i, word in enumerate(words) if word == "--set"] == [
        "dataset.max_pixels=1000000", "train.transform.scale=[0.5, 1.0]", "dataset.on_bad_image=raise"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_intact_cache_still_gives_its_own_pixels(built, backend):
    """The checks refuse nothing the build wrote: the cached loader and the image files agree."""
    path, _ = built
    cached = build_loader(path, "train", [f"backend={backend}"])
    plain = build_loader(path, "train", [f"backend={backend}", "dataset.cache=null"])
    assert [identities(x) for x, _ in cached] == [identities(x) for x, _ in plain]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pixel_file_cut_short_after_the_loader_was_built_stops_the_epoch_naming_it(built, backend):
    """Not a skip of every sample blaming its source image (torch), nor a raw numpy error (DALI).
    In this process, which maps the file after the cut: a worker that mapped it before faults
    (SIGBUS), which no check can prevent (docs/cache.md)."""
    path, folder = built
    loader = build_loader(path, "train", [f"backend={backend}"])
    with open(folder / "pixels.u8", "r+b") as handle:
        handle.truncate(1000)
    with pytest.raises(CacheError, match=f"{folder / 'pixels.u8'} holds 1,000 bytes.*Rebuild it with `fastloader"):
        for _ in loader:
            pass
    assert loader.bad_samples == []


def test_the_rebuild_command_never_shows_a_store_option_given_as_an_override(built, caplog):
    """A secret given with --set (dataset.remote.options.secret_access_key) stays out of the error and
    the log; the command names the key, with a placeholder that says to give it again."""
    path, folder = built
    (folder / "pixels.u8").write_bytes(b"")
    with pytest.raises(CacheError) as error:
        build_loader(path, "train", ["dataset.remote.options.secret_access_key=TOPSECRET-41",
                                     "dataset.remote.options={region: eu-west-1, token: TOPSECRET-42}"])
    shown = str(error.value) + caplog.text
    assert "TOPSECRET" not in shown
    words = shlex.split(str(error.value).split("Rebuild it with `")[1].rstrip("`"))
    assert "dataset.remote.options={region: '<not shown: give it again>', token: '<not shown: give it again>'}" \
        in words, words
