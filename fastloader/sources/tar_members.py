"""One tar shard's samples: its members grouped by key, with each image's byte range and label text.

Headers are read with Python's `tarfile` (ustar, PAX and GNU long names, all of them), without
reading the images: a shard is one open and a seek per member; or, where `fastloader pack` wrote the
shard's index beside it (`shard.tar.idx`, checked against the shard's size and first and last bytes),
that one small file. Only the label members (`.cls`,
`.txt`, `.json`: a few bytes each) are read, and, for each image, a digest of its own header block
(the reader checks it at every read) and of the shard's first and last bytes (a cached index is
checked against it). What cannot become a sample is returned as a problem
named by its member, never dropped silently.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..locations import TAR_BLOCK, Identity, NotRegularFile, header_digest, open_regular
from ..paths import cache_home

log = logging.getLogger("fastloader")

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
    etag: str = ""
    """A shard in an object store: its ETag as indexed (with its size, what says it is the same object)."""
    labels: str = ""
    """A shard in an object store indexed through its `.idx`: labels_digest of the label members the
    index gave, unread then (a request each); its node-cache copy is checked against it (reading.py)."""

    def stamp(self) -> tuple[int, int, int, int]:
        """What os.stat says of the shard as indexed; any difference means it is read again."""
        return self.inode, self.size, self.mtime_ns, self.ctime_ns

    @property
    def identity(self) -> Identity:
        return Identity(self.inode, self.size, self.mtime_ns, self.etag, labels=self.labels)


def edge_digest(fd: int, size: int) -> str:
    """A digest of the shard's first and last EDGE_BYTES: what a cached index is checked against
    besides os.stat, on file systems whose inode and ctime say less than they should."""
    return edge_digest_of(lambda length, offset: os.pread(fd, length, offset), size)


def edge_digest_of(pread: Callable[[int, int], bytes], size: int) -> str:
    """edge_digest through any `pread(length, offset)` (a local file's, or ranged requests')."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(pread(EDGE_BYTES, 0))
    if size > EDGE_BYTES:
        digest.update(pread(EDGE_BYTES, max(EDGE_BYTES, size - EDGE_BYTES)))
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
            beside = _index_file_text(path + INDEX_SUFFIX)
            scan_file(handle, lambda length, offset: os.pread(handle.fileno(), length, offset), scan,
                      image_extensions, path, beside)
    except FileNotFoundError:
        return ShardScan(0, 0, problems=[("", "missing (no such file)")])
    except PermissionError:
        return ShardScan(0, 0, problems=[("", "unreadable: permission denied")])
    except NotRegularFile as error:  # a FIFO is never waited on
        return ShardScan(0, 0, problems=[("", str(error.strerror))])
    except (OSError, tarfile.TarError) as error:
        return ShardScan(0, 0, problems=[("", f"unreadable: {error}")])
    return scan


def scan_file(handle, pread: Callable[[int, int], bytes], scan: ShardScan, image_extensions: tuple[str, ...],
              name: str, beside: bytes | None = None, check_labels: bool = True, check_headers: bool = False) -> None:
    """Fill `scan` (its size and digest set) from the index file beside the shard where it is the
    shard's (`beside`: its text), else from the shard's own headers, read through `handle` (a file
    object tarfile walks) and `pread(length, offset)`. `check_labels`: each label member the index
    names is read and compared (a local shard: a small pread each); without it (a request each over
    a network) the index's labels_digest is kept, for the shard's whole copy to be checked against.
    `check_headers`: every member's tar header is read where the index says it is (an index found
    stale before, whose byte ranges may lie)."""
    problem = compression_problem(pread(8, 0), name)
    if problem:
        scan.problems.append(("", problem))
        return
    members = read_index_file(beside, scan) if beside is not None else None
    if members is not None and check_labels:
        wrong = index_file_lies(members, pread, check_headers)
        if wrong:
            log.warning("%s%s does not describe the shard it stands beside: %s; the shard's own headers are read "
                        "instead (`fastloader pack` writes a true one)", name, INDEX_SUFFIX, wrong)
            members = None
    elif members is not None:  # believed for now: checked against the shard's whole copy before it is read
        scan.labels = labels_digest(members)
    if members is None:
        handle.seek(0)
        members = read_members(handle, pread, scan)
    group_samples(members, scan, image_extensions)


@dataclass
class Member:
    """A regular file in a tar shard: where its bytes are, its header's digest, a label member's text."""
    name: str
    start: int
    length: int
    header: int
    """reading.header_digest of the member's own 512-byte header block."""
    text: str | None = None
    """A possible label member's text (`.cls`, `.txt`, `.json` up to LABEL_BYTES), else None."""


def read_members(handle, pread: Callable[[int, int], bytes], scan: ShardScan) -> list[Member]:
    """Every regular file's Member, from the tar headers (tarfile walks `handle`); what stops the
    walk is a problem of the scan (not a tar, damaged, truncated), the members before it kept."""
    members: list[Member] = []
    last = None
    try:
        archive = tarfile.open(fileobj=handle, mode="r:")
    except tarfile.ReadError as error:
        scan.problems.append(("", f"not a tar archive ({error}); a shard is a plain POSIX tar of {{key}}.jpg + "
                                  f"{{key}}.cls members (`fastloader pack` writes them)"))
        return members
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
        text = None
        if parts is not None and parts[1] in LABEL_SUFFIXES and info.size <= LABEL_BYTES:
            text = pread(info.size, info.offset_data).decode("utf-8", "replace")
        members.append(Member(info.name, info.offset_data, info.size,
                              header_digest(pread(TAR_BLOCK, info.offset_data - TAR_BLOCK)), text))
    return members


def group_samples(members: list[Member], scan: ShardScan, image_extensions: tuple[str, ...]) -> None:
    """The members grouped by key into samples (an image and its label) in `scan.samples`; what cannot
    be one (no extension, a duplicate, a label without an image) in `scan.problems`."""
    samples: dict[str, ShardSample] = {}
    labels: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for member in members:
        parts = split_key(member.name)
        if parts is None:
            scan.problems.append((member.name, "not a sample's member: its name has no extension (webdataset "
                                               "names members {key}.{ext})"))
            continue
        key, extension = parts
        if member.name in seen:
            scan.problems.append((member.name, "duplicate member: the name appears again in the shard; the first "
                                               "is kept"))
            continue
        seen.add(member.name)
        if extension in image_extensions:
            if key in samples:
                scan.problems.append((member.name, f"duplicate key: {key!r} already has the image "
                                                   f"{samples[key].member!r}; the first is kept"))
            else:
                samples[key] = ShardSample(key, member.name, member.start, member.length, header=member.header)
        elif member.text is not None:
            labels.setdefault(key, {})[extension] = member.text
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


INDEX_SUFFIX = ".idx"
"""The index `fastloader pack` writes beside each shard (`train-000000.tar.idx`): its members, so that
a loader indexes the shard with one small read instead of a read per member (a request each, remotely)."""
INDEX_FILE_FORMAT = "fastloader shard index"
INDEX_FILE_VERSION = 1


def index_file_bytes(path: str) -> bytes:
    """The index file of a complete local shard: its size, edge digest and members, as JSON."""
    with open(open_regular(path), "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        scan = ShardScan(size, 0, digest=edge_digest(handle.fileno(), size))
        members = read_members(handle, lambda length, offset: os.pread(handle.fileno(), length, offset), scan)
    return json.dumps({"format": INDEX_FILE_FORMAT, "version": INDEX_FILE_VERSION, "size": scan.size,
                       "digest": scan.digest, "problems": scan.problems,
                       "members": [[m.name, m.start, m.length, m.header, m.text] for m in members]},
                      separators=(",", ":")).encode("utf-8")


def read_index_file(text: bytes, scan: ShardScan) -> list[Member] | None:
    """The members an index file lists, where it describes this very shard (the same size and first
    and last bytes as `scan` holds); None where it does not (the shard is then read itself)."""
    try:
        data = json.loads(text)
        if data.get("format") != INDEX_FILE_FORMAT or data.get("version") != INDEX_FILE_VERSION or \
                data.get("size") != scan.size or data.get("digest") != scan.digest:
            return None
        members = [Member(str(name), int(start), int(length), int(header), text)
                   for name, start, length, header, text in data["members"]]
        if any(not TAR_BLOCK <= member.start <= member.start + member.length <= scan.size or
               (member.text is not None and (not isinstance(member.text, str) or member.length > LABEL_BYTES))
               for member in members):
            return None  # a range past the shard's end (a length of 2**40 would be allocated at read)
        scan.problems += [(str(member), str(reason)) for member, reason in data["problems"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return members


def index_file_lies(members: list[Member], pread: Callable[[int, int], bytes], headers: bool = False) -> str | None:
    """Why an index file's label members are not the shard's (their header or their text), or None.
    The labels decide what a model learns: an index kept after a `.cls` member was rewritten in place,
    or written by anyone else, is never believed on its size and edge bytes alone. `headers`: every
    other member's header is checked too (its byte range: an index whose offsets were found to lie)."""
    for member in members:
        if member.text is None:
            if headers and header_digest(pread(TAR_BLOCK, member.start - TAR_BLOCK)) != member.header:
                return f"the tar header of {member.name} is not the one it lists"
            continue
        block = pread(TAR_BLOCK + member.length, member.start - TAR_BLOCK)
        if len(block) != TAR_BLOCK + member.length or header_digest(block[:TAR_BLOCK]) != member.header:
            return f"the tar header of {member.name} is not the one it lists"
        if block[TAR_BLOCK:].decode("utf-8", "replace") != member.text:
            return (f"{member.name} holds {block[TAR_BLOCK:][:40].decode('utf-8', 'replace')!r}, the index says "
                    f"{member.text[:40]!r}")
    return None


def labels_digest(members: list[Member]) -> str:
    """A digest of the label members (name, place, header, text): what a shard's copy must give again."""
    digest = hashlib.blake2b(digest_size=8)
    for member in members:
        if member.text is not None:
            digest.update(json.dumps([member.name, member.start, member.length, member.header, member.text]).encode())
    return digest.hexdigest()


def copy_labels_digest(fd: int) -> tuple[str, list[tuple[str, str]]]:
    """labels_digest of a complete local copy of a shard, from its own headers (a walk of a local
    file: milliseconds for a thousand members), and what stopped the walk (a damaged copy)."""
    scan = ShardScan(os.fstat(fd).st_size, 0)
    with io.BufferedReader(io.FileIO(fd, closefd=False), 1 << 16) as handle:
        members = read_members(handle, lambda length, offset: os.pread(fd, length, offset), scan)
    return labels_digest(members), scan.problems


def stale_index_marker(url: str, etag: str) -> Path:
    """The file that says a shard's `.idx` was found to give other labels than the shard (under
    that ETag): the next scan of the shard reads its label members to check the index, instead of
    believing it (a request each), so a new loader is right without a hand-cleaned cache."""
    name = hashlib.blake2b(f"{url}\0{etag}".encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
    return cache_home() / "shards" / "stale-indexes" / name


def mark_stale_index(url: str, etag: str) -> Path:
    marker = stale_index_marker(url, etag)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(url + "\n")
    except OSError as error:  # the run stops anyway; the next scan then trusts the index again
        log.warning("could not remember that %s%s is stale in %s (%s); delete or rewrite that index before the "
                    "next run", url, INDEX_SUFFIX, marker, error)
    return marker


def _index_file_text(path: str) -> bytes | None:
    try:
        with open(open_regular(path), "rb") as handle:
            return handle.read()
    except OSError:
        return None
