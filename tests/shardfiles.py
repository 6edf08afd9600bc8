"""Tar shards for the tests: a folder split packed in its index order, and a corpus of bad shards,
each holding one kind of damage next to good samples, with what a loader must make of it."""
from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

from PIL import Image


def add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def png_bytes(colour=(200, 30, 30), size=(40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def pack_folder_split(split_dir: Path, out: Path, prefix: str, per_shard: int,
                      tar_format: int = tarfile.GNU_FORMAT) -> list[Path]:
    """The split's images, in the order a folder index lists them (sorted classes, sorted files), as
    shards of `per_shard` samples: `{class}/{stem}.{ext}` + `{class}/{stem}.cls` (the class number)."""
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    samples = [(path, label) for label, name in enumerate(classes)
               for path in sorted((split_dir / name).iterdir())]
    out.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, first in enumerate(range(0, len(samples), per_shard)):
        shard = out / f"{prefix}-{number:06d}.tar"
        with tarfile.open(shard, "w", format=tar_format) as archive:
            for path, label in samples[first:first + per_shard]:
                key = f"{path.parent.name}/{path.stem}"
                add_member(archive, f"{key}{path.suffix.lower()}", path.read_bytes())
                add_member(archive, f"{key}.cls", f"{label}\n".encode())
        shards.append(shard)
    return shards


def resumes_and_evaluates_once(config: dict) -> None:
    """The config's train split, stopped after 2 batches and resumed, yields the rest of the epoch;
    its val split over 3 ranks yields every sample exactly once."""
    from fastloader import build_loader

    batches = [labels.tolist() for _, labels in build_loader(config, "train")]
    interrupted = build_loader(config, "train")
    iterator = iter(interrupted)
    for _ in range(2):
        next(iterator)
    state = interrupted.state_dict()
    interrupted.close()
    resumed = build_loader(config, "train")
    resumed.load_state_dict(state)
    assert [labels.tolist() for _, labels in resumed] == batches[2:]
    seen = []
    for rank in range(3):  # eval sharded over 3 ranks: every sample exactly once
        ranked = build_loader({**config, "distributed": {"rank": rank, "world_size": 3}}, "val")
        seen += [label for _, labels in ranked for label in labels.tolist()]
    assert sorted(seen) == sorted(build_loader(config, "val").index.labels.tolist())


GOOD_PER_SHARD = 2
"""Good samples next to the damage in each bad shard (labels 0 and 1)."""


def write_bad_corpus(out: Path) -> tuple[list[str], dict[str, str], int]:
    """(the shard patterns of a split, {name of each bad thing: a word its reason holds}, how many
    good samples the split holds)."""
    out.mkdir(parents=True, exist_ok=True)
    bad: dict[str, str] = {}

    def shard(name: str, extra, tar_format=tarfile.GNU_FORMAT) -> Path:
        path = out / name
        with tarfile.open(path, "w", format=tar_format) as archive:
            for i in range(GOOD_PER_SHARD):
                add_member(archive, f"{path.stem}_good{i}.png", png_bytes((60 * i, 100, 50)))
                add_member(archive, f"{path.stem}_good{i}.cls", str(i).encode())
            extra(archive)
        return path

    shard("a-clean.tar", lambda archive: None)
    # a member that is not an image, a key without a label, a label that is no number, a key without
    # an image, a duplicate key: each skipped, the shard's good samples kept
    not_image = shard("b-notimage.tar", lambda a: (add_member(a, "page.jpg", b"<html>404 Not Found</html>"),
                                                   add_member(a, "page.cls", b"1")))
    bad[f"{not_image}:page.jpg"] = "not an image"
    no_label = shard("c-nolabel.tar", lambda a: add_member(a, "orphan.png", png_bytes()))
    bad[f"{no_label}:orphan.png"] = "no label"
    bad_label = shard("d-badlabel.tar", lambda a: (add_member(a, "cat.png", png_bytes()),
                                                   add_member(a, "cat.cls", b"tabby")))
    bad[f"{bad_label}:cat.png"] = "not an integer"
    duplicate = shard("e-duplicate.tar", lambda a: (add_member(a, "e-duplicate_good0.jpeg", png_bytes()),))
    bad[f"{duplicate}:e-duplicate_good0.jpeg"] = "duplicate key"
    # long names: PAX and GNU headers carry them; these samples are good
    long_key = "deep/" + "x" * 120

    def long_named(label: bytes):
        return lambda a: (add_member(a, f"{long_key}.png", png_bytes()), add_member(a, f"{long_key}.cls", label))
    shard("f-pax.tar", long_named(b"0"), tar_format=tarfile.PAX_FORMAT)
    shard("g-gnu.tar", long_named(b"1"), tar_format=tarfile.GNU_FORMAT)
    # cut short inside its last image: the samples before it are read
    big = png_bytes(size=(300, 300)) + os.urandom(4000)
    truncated = shard("h-truncated.tar", lambda a: (add_member(a, "big.png", big), add_member(a, "big.cls", b"0")))
    data = truncated.read_bytes()
    cut = data.index(b"big.png")
    truncated.write_bytes(data[:cut + 512 + 200])
    bad[f"{truncated}:big.png"] = "truncated"
    compressed = out / "i-compressed.tar.gz"
    compressed.write_bytes(gzip.compress((out / "a-clean.tar").read_bytes()))
    bad[str(compressed)] = "compressed with gzip"
    missing = out / "j-missing.tar"
    bad[str(missing)] = "missing"
    patterns = [str(out / "[a-h]-*.tar"), str(compressed), str(missing)]
    good = GOOD_PER_SHARD * 8 + 2  # every shard's good pair (the duplicate's first kept), the two long names
    return patterns, bad, good
