"""One tar shard's samples: its members grouped by key, with each image's byte range and label text.

Headers are read with Python's `tarfile` (ustar, PAX and GNU long names, all of them), without
reading the images: a shard is one open and a seek per member. Only the label members (`.cls`,
`.txt`, `.json`: a few bytes each) are read, and, for each image, a digest of its own header block
(the reader checks it at every read) and of the shard's first and last bytes (a cached index is
checked against it). What cannot become a sample is returned as a problem
named by its member, never dropped silently.
"""
from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass, field

from .reading import TAR_BLOCK, Identity, NotRegularFile, header_digest, open_regular

COMPRESSIONS = ((b"\x1f\x8b", "gzip", "gunzip -k"), (b"BZh", "bzip2", "bunzip2 -k"),
                (b"\xfd7zXZ\x00", "xz", "unxz -k"), (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"))
"""(magic, name, the command that decompresses it): a compressed tar has no random access to its members."""
LABEL_SUFFIXES = ("cls", "txt", "json")
"""Members that may hold a sample's label, in the order they are preferred."""
LABEL_BYTES = 4096
"""A label member larger than this is not read (it is not a label)."""
EDGE_BYTES = 16384
"""The shard's first and last this many bytes make its content digest (`edge_digest`): a few member
headers at each end, read in two preads when a cached index is checked."""


@dataclass
class ShardSample:
    key: str
    member: str
    """The image member's name: `{key}.{ext}`."""
    start: int
    length: int
    label_kind: str | None = None
    """Which member gave the label text: cls, txt, json; None: the sample has none."""
    label_text: str | None = None
    header: int = 0
    """reading.header_digest of the image member's tar header block, checked at every read."""


@dataclass
class ShardScan:
    size: int
    mtime_ns: int
    samples: list[ShardSample] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    """(member, or '' for the whole shard; reason)."""
    inode: int = 0
    ctime_ns: int = 0
    """Changed by every write, and no tool sets it back (`cp -p` and `touch -d` restore mtime only)."""
    digest: str = ""
    """edge_digest of the shard as read."""

    def stamp(self) -> tuple[int, int, int, int]:
        """What os.stat says of the shard as indexed; any difference means it is read again."""
        return self.inode, self.size, self.mtime_ns, self.ctime_ns

    @property
    def identity(self) -> Identity:
        return Identity(self.inode, self.size, self.mtime_ns)


def edge_digest(fd: int, size: int) -> str:
    """A digest of the shard's first and last EDGE_BYTES: what a cached index is checked against
    besides os.stat, on file systems whose inode and ctime say less than they should."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(os.pread(fd, EDGE_BYTES, 0))
    if size > EDGE_BYTES:
        digest.update(os.pread(fd, EDGE_BYTES, max(EDGE_BYTES, size - EDGE_BYTES)))
    return digest.hexdigest()


def split_key(name: str) -> tuple[str, str] | None:
    """WebDataset's rule: the key is the name up to the first dot of its last path component, the
    extension the rest (lowercased); None for a name without one."""
    folder, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    if not dot or not stem:
        return None
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def compression_problem(head: bytes, shard: str) -> str | None:
    for magic, name, command in COMPRESSIONS:
        if head.startswith(magic):
            return (f"compressed with {name}: a compressed shard has no random access to its members; "
                    f"decompress it to a plain .tar (`{command} {os.path.basename(shard)}`) or repack the images "
                    f"with `fastloader pack`")
    return None


def scan_shard(path: str, image_extensions: tuple[str, ...]) -> ShardScan:
    """The shard's samples and problems. `image_extensions` without dots, lowercase ("jpg", "png")."""
    try:
        with open(open_regular(path), "rb") as handle:
            info = os.fstat(handle.fileno())
            scan = ShardScan(info.st_size, info.st_mtime_ns, inode=info.st_ino, ctime_ns=info.st_ctime_ns,
                             digest=edge_digest(handle.fileno(), info.st_size))
            problem = compression_problem(handle.read(8), path)
            if problem:
                scan.problems.append(("", problem))
                return scan
            handle.seek(0)
            _read_members(handle, scan, image_extensions)
    except FileNotFoundError:
        return ShardScan(0, 0, problems=[("", "missing (no such file)")])
    except PermissionError:
        return ShardScan(0, 0, problems=[("", "unreadable: permission denied")])
    except NotRegularFile as error:  # a FIFO is never waited on
        return ShardScan(0, 0, problems=[("", str(error.strerror))])
    except (OSError, tarfile.TarError) as error:
        return ShardScan(0, 0, problems=[("", f"unreadable: {error}")])
    return scan


def _read_members(handle, scan: ShardScan, image_extensions: tuple[str, ...]) -> None:
    samples: dict[str, ShardSample] = {}
    labels: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    last = None
    try:
        archive = tarfile.open(fileobj=handle, mode="r:")
    except tarfile.ReadError as error:
        scan.problems.append(("", f"not a tar archive ({error}); a shard is a plain POSIX tar of {{key}}.jpg + "
                                  f"{{key}}.cls members (`fastloader pack` writes them)"))
        return
    while True:
        try:
            info = archive.next()
        except (tarfile.TarError, EOFError) as error:
            after = f" after member {last!r}" if last else ""
            scan.problems.append(("", f"damaged or truncated{after} ({error}); the members before it are read"))
            break
        if info is None:
            break
        if not info.isfile():
            continue
        last = info.name
        if info.offset_data + info.size > scan.size:
            scan.problems.append((info.name, f"truncated: the shard ends {info.offset_data + info.size - scan.size} "
                                             f"bytes before this member does"))
            break
        parts = split_key(info.name)
        if parts is None:
            scan.problems.append((info.name, "not a sample's member: its name has no extension (webdataset "
                                             "names members {key}.{ext})"))
            continue
        key, extension = parts
        if info.name in seen:
            scan.problems.append((info.name, "duplicate member: the name appears again in the shard; the first "
                                             "is kept"))
            continue
        seen.add(info.name)
        if extension in image_extensions:
            if key in samples:
                scan.problems.append((info.name, f"duplicate key: {key!r} already has the image "
                                                 f"{samples[key].member!r}; the first is kept"))
            else:
                block = os.pread(handle.fileno(), TAR_BLOCK, info.offset_data - TAR_BLOCK)
                samples[key] = ShardSample(key, info.name, info.offset_data, info.size, header=header_digest(block))
        elif extension in LABEL_SUFFIXES and info.size <= LABEL_BYTES:
            labels.setdefault(key, {})[extension] = os.pread(handle.fileno(), info.size, info.offset_data).decode(
                "utf-8", "replace")
    for key, sample in samples.items():
        found = labels.pop(key, {})
        for kind in LABEL_SUFFIXES:
            if kind in found:
                sample.label_kind, sample.label_text = kind, found[kind]
                break
        scan.samples.append(sample)
    for key, found in labels.items():
        names = ", ".join(f"{key}.{kind}" for kind in found)
        scan.problems.append((f"{key}.{next(iter(found))}", f"no image member for key {key!r} (only {names})"))
