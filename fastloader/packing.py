"""Write a split's samples as WebDataset tar shards: `{key}.{ext}` (the image's own bytes; `.jpg` for
every JPEG, as `.to_tuple("jpg", "cls")` expects) and `{key}.cls` (its label), in plain POSIX tar that
webdataset, timm, DALI's `readers.webdataset` and `dataset.format: webdataset` all read, and the class
names beside them in `{prefix}-classes.txt`, which the loader reads, and each shard's index beside it
(`{prefix}-000000.tar.idx`: its members and byte ranges, checked against the shard's size and first and
last bytes), which the loader reads instead of the shard's headers: a request per shard, not per member,
when the shards are in an object store.

Keys come from the sample's name, its dots replaced (webdataset splits a key at the first dot of a
name) and a clash numbered, never dropped. Samples go in a seeded shuffled order by default:
streaming readers read shards in sequence, so each shard should hold a mix of classes. Shards are
written under a temporary name and renamed when complete, and their bytes depend only on the
samples and the seed (mtime 0, no owner), so packing twice gives the same shards.

What is packed is checked first: the header check of `fastloader check` on the very bytes written (a
`passwd` named .jpg is not an image), and no link out of the dataset is followed unless asked. Every
file is created new (mkstemp in the output folder) and renamed over its name, so a link planted in the
output folder is replaced, never written through.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass, field

import numpy as np

from .decoding.screen import screen_bytes
from .errors import ConfigError
from .locations import Location
from .progress import Progress
from .samples import SampleIndex
from .schema import Config
from .sources.reading import read_bytes
from .sources.tar_members import INDEX_SUFFIX, index_file_bytes
from .sources.webdataset import CLASSES_FILE

MEMBER_EXTENSIONS = {"JPEG": ".jpg", "PNG": ".png", "GIF": ".gif", "WEBP": ".webp", "BMP": ".bmp"}
"""The member suffix of each format, whatever the file's own suffix (`.JPEG`, `.jpeg` and a PNG named
`.jpg` alike); other formats keep their file's suffix."""

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


def check_prefix(prefix: str, option: str = "--prefix") -> None:
    """A shard name's prefix is one plain file name: `/`, `..` or a leading `.` would put shards and
    the classes file outside the output folder, or hide them (ConfigError naming `option`)."""
    if not prefix or "/" in prefix or "\0" in prefix or prefix.startswith(".") or \
            (os.altsep and os.altsep in prefix):
        raise ConfigError(f"{option}: {prefix!r} is not a plain name: shards are written as PREFIX-000000.tar in the "
                          f"output folder (--out), so the prefix may hold no '/' and may not start with '.'; give a "
                          f"name such as 'train' or 'imagenet-train'")


def pack_index(config: Config, index: SampleIndex, out_dir: str, prefix: str, *, max_bytes: int = 256 << 20,
               max_count: int | None = None, shuffle_seed: int | None = 0, inside: str | None = None) -> Packed:
    """The samples of `index` as `{prefix}-{n:06d}.tar` shards in out_dir, a new shard before the
    next sample would pass max_bytes (of image data) or max_count samples, and the class names in
    `{prefix}-classes.txt`. A sample that cannot be read, is not an image, or (with `inside`, a folder)
    is reached through a link to a file outside that folder follows dataset.on_bad_image."""
    check_prefix(prefix)
    output_folder(out_dir)
    order = np.arange(len(index))
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(index))
    keys = sample_keys(index)
    packed = Packed()
    shard: _NewFile | None = None
    archive, in_shard, shard_bytes = None, 0, 0
    progress = Progress(len(index), "images")
    inside = os.path.realpath(inside) if inside else None

    def close() -> None:
        nonlocal archive, shard
        if archive is not None:
            archive.close()
            path = shard.commit()
            archive = shard = None
            beside = _NewFile(out_dir, os.path.basename(path) + INDEX_SUFFIX)
            try:
                beside.file.write(index_file_bytes(path))
                beside.commit()
            except BaseException:
                beside.discard()
                raise
            packed.shards.append(path)

    try:
        for done, sample in enumerate(order.tolist(), 1):
            location = index.location(sample)
            data, extension, problem = _checked_bytes(location, config.dataset.max_pixels, inside)
            if problem:
                packed.skipped += config.on_bad_image.refuse([(location.name, problem)], "not packed")
                progress.advance()
                continue
            if archive is not None and (shard_bytes + len(data) > max_bytes or (max_count and in_shard >= max_count)):
                close()
            if archive is None:
                shard = _NewFile(out_dir, f"{prefix}-{len(packed.shards):06d}.tar")
                archive = tarfile.open(fileobj=shard.file, mode="w", format=tarfile.PAX_FORMAT)
                in_shard = shard_bytes = 0
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
        if shard is not None:  # interrupted: no partial shard is left looking whole
            if archive is not None:
                with contextlib.suppress(OSError):  # fails as the write did, on a full disk
                    archive.close()
            shard.discard()
        progress.finish()
    names = _NewFile(out_dir, CLASSES_FILE.format(prefix=prefix))
    names.file.write("".join(f"{name}\n" for name in index.classes).encode("utf-8"))
    names.commit()
    return packed


def output_folder(out_dir: str) -> None:
    """Make the shards' folder, or say why it cannot be one (a file of that name: not [Errno 17])."""
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        what = "a symbolic link to nothing" if os.path.islink(out_dir) else "a file, not a folder"
        raise ConfigError(f"--out: {out_dir} is {what}; pass a folder for the shards (created if needed), e.g. "
                          f"{os.path.splitext(out_dir)[0]}-shards")
    os.makedirs(out_dir, exist_ok=True)


def _checked_bytes(location: Location, max_pixels: int, inside: str | None) -> tuple[bytes, str, str | None]:
    """(the sample's bytes, its member suffix, None), or (b"", "", why it is not packed)."""
    if inside is not None and location.whole_file:  # reached through a link, and out of the dataset
        real = os.path.realpath(location.file)
        if real != os.path.abspath(location.file) and os.path.commonpath([real, inside]) != inside:
            return b"", "", (f"a symbolic link to {real}, outside the dataset ({inside}); pack reads only files "
                             f"inside it (--follow-links packs such files too)")
    try:
        data = bytes(read_bytes(location))
    except OSError as error:
        return b"", "", f"unreadable: {error.strerror or error}"
    screened = screen_bytes(location.name, data, max_pixels)
    if screened.problem:
        return b"", "", screened.problem
    own = os.path.splitext(location.name)[1].lower()
    return data, MEMBER_EXTENSIONS.get(screened.format or "", own or ".jpg"), None


class _NewFile:
    """A file written under a new, unique name in its folder (mkstemp: O_EXCL, so never through a
    planted link), then renamed over `name` when complete (a link of that name is replaced, not
    followed), or removed."""

    def __init__(self, folder: str, name: str):
        self.final = os.path.join(folder, name)
        descriptor, self.temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(descriptor, 0o666 & ~umask)
        self.file = os.fdopen(descriptor, "wb")

    def commit(self) -> str:
        self.file.close()
        os.replace(self.temporary, self.final)
        return self.final

    def discard(self) -> None:
        with contextlib.suppress(OSError):  # closing flushes, and fails as the write did on a full disk
            self.file.close()
        try:
            os.unlink(self.temporary)
        except FileNotFoundError:
            pass


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
