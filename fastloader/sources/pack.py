"""Write a split's samples as WebDataset tar shards: `{key}.{ext}` (the image's own bytes) and
`{key}.cls` (its label), in plain POSIX tar that webdataset, timm, DALI's `readers.webdataset` and
`dataset.format: webdataset` all read.

Keys come from the sample's name, its dots replaced (webdataset splits a key at the first dot of a
name) and a clash numbered, never dropped. Samples go in a seeded shuffled order by default:
streaming readers read shards in sequence, so each shard should hold a mix of classes. Shards are
written under a temporary name and renamed when complete, and their bytes depend only on the
samples and the seed (mtime 0, no owner), so packing twice gives the same shards.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import tarfile
from dataclasses import dataclass, field

import numpy as np

from ..bad_input import refuse
from ..progress import Progress
from ..samples import SampleIndex
from ..schema import Config
from .reading import read_bytes

_NOT_KEY = re.compile(r"[^\w/-]")


@dataclass
class Packed:
    shards: list[str] = field(default_factory=list)
    samples: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)


def sample_keys(index: SampleIndex) -> list[str]:
    """One key a sample, unique: its name less the extension, with every character a key must not hold
    (dots, ':', spaces) replaced by '_'; a clash gets `_1`, `_2` ..."""
    keys, taken = [], set()
    for i in range(len(index)):
        name = index.relpath(i).replace(".tar:", "/")
        stem = _NOT_KEY.sub("_", os.path.splitext(name)[0].lstrip("/"))
        key, number = stem, 0
        while key in taken:
            number += 1
            key = f"{stem}_{number}"
        taken.add(key)
        keys.append(key)
    return keys


def pack_index(config: Config, index: SampleIndex, out_dir: str, prefix: str, *, max_bytes: int = 256 << 20,
               max_count: int | None = None, shuffle_seed: int | None = 0) -> Packed:
    """The samples of `index` as `{prefix}-{n:06d}.tar` shards in out_dir, a new shard before the
    next sample would pass max_bytes (of image data) or max_count samples. A sample that cannot be
    read follows dataset.on_bad_image."""
    os.makedirs(out_dir, exist_ok=True)
    order = np.arange(len(index))
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(index))
    keys = sample_keys(index)
    packed = Packed()
    archive, partial, in_shard, shard_bytes = None, "", 0, 0
    progress = Progress(len(index), "images")

    def close() -> None:
        nonlocal archive
        if archive is not None:
            archive.close()
            final = partial[:-len(".partial")]
            os.replace(partial, final)
            packed.shards.append(final)
            archive = None

    try:
        for done, sample in enumerate(order.tolist(), 1):
            location = index.location(sample)
            try:
                data = bytes(read_bytes(location))
            except OSError as error:
                packed.skipped += refuse(config, [(location.name, f"unreadable: {error.strerror or error}")],
                                         "not packed")
                progress.advance()
                continue
            if archive is not None and (shard_bytes + len(data) > max_bytes or (max_count and in_shard >= max_count)):
                close()
            if archive is None:
                partial = os.path.join(out_dir, f"{prefix}-{len(packed.shards):06d}.tar.partial")
                archive = tarfile.open(partial, "w", format=tarfile.PAX_FORMAT)
                in_shard = shard_bytes = 0
            extension = os.path.splitext(location.name)[1].lower() or ".jpg"
            _add(archive, f"{keys[sample]}{extension}", data)
            _add(archive, f"{keys[sample]}.cls", b"%d" % index.label(sample))
            in_shard += 1
            shard_bytes += len(data)
            packed.samples += 1
            packed.bytes += len(data)
            if done % 256 == 0:
                progress.update(done)
        close()
    finally:
        if archive is not None:  # interrupted: no partial shard is left looking whole
            with contextlib.suppress(OSError):  # fails as the write did, on a full disk
                archive.close()
            os.unlink(partial)
        progress.finish()
    with open(os.path.join(out_dir, f"{prefix}-classes.txt"), "w", encoding="utf-8") as handle:
        handle.write("".join(f"{name}\n" for name in index.classes))
    return packed


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o444, "", ""
    archive.addfile(info, io.BytesIO(data))


def shard_pattern(shards: list[str]) -> str:
    """The brace range that names these shards, as `<split>.shards` takes it."""
    first, last = os.path.basename(shards[0]), os.path.basename(shards[-1])
    if len(shards) == 1:
        return first
    prefix = first[:-len("000000.tar")]
    return f"{prefix}{{{first[len(prefix):-4]}..{last[len(prefix):-4]}}}.tar"
