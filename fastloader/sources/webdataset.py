"""WebDataset tar shards: `<split>.shards` (paths, globs, brace ranges) -> the split's SampleIndex.

A sample is a key's image member (`{key}.jpg`, or another of dataset.extensions) and its label:
the `{key}.cls` member (an integer), else a `.txt` / `.json` member naming a class of
dataset.classes. Samples are in shard order, then member order; names are `shard.tar:member`.

Each shard's headers are read once (`tar_members.py`, shards in parallel processes, with a progress
bar) and the result is kept in one cache file per split. A cached shard is read again when it is not
the same file: another inode, size, mtime or ctime (which every write changes, and `cp -p` cannot set
back), or other first and last bytes. The index carries each shard's identity and each member's
header digest, which the reader checks (sources/reading.py), so a shard changed under a running
loader is refused by name, never read at its old offsets. Reading is by byte range afterwards, so
the sampler's permutation, exact-once eval, resume and the uint8 cache work on shards as on folders.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import itertools
import json
import logging
import math
import os
import re
import tarfile
import time
from array import array
from typing import NamedTuple, Sequence

import numpy as np

from ..errors import BadImageError, ConfigError
from ..locations import open_regular, stat_stamp
from ..parallel import available_cores, map_chunks
from ..paths import cache_home
from ..progress import Progress
from ..samples import ByteRanges, IndexBuilder, SampleIndex, label_problem
from ..schema import DEFAULT_ROOT_ORIGIN, Config, SplitConfig
from ..words import plural
from . import remote
from .class_names import read_class_names
from .exclude import read_exclude_list
from .registry import Format, client_of, indexed, register_format
from .tar_members import (
    INDEX_SUFFIX,
    ShardSample,
    ShardScan,
    edge_digest,
    edge_digest_of,
    scan_file,
    scan_shard,
    stale_index_marker,
)

log = logging.getLogger("fastloader")

INDEX_VERSION = 3
"""Raised when a cached shard index would read otherwise: 2, each shard's inode, ctime and edge
digest, each member's header digest; 3, the labels digest of a remote shard's unchecked `.idx`."""
IN_PROCESS_UP_TO = 16
"""Up to this many shards to read are read in this process (tens of ms a shard), with no worker
processes to start (about a second)."""
_BRACES = re.compile(r"\{([^{}]*)\}")


MAX_SHARDS = 1_000_000
"""The most shard paths a split's patterns may expand to: `{0..99999999999}` is refused at once, with
its key, instead of filling the memory with names."""


class _Numbers:
    """The words of a numeric range, counted without being made (`{0..99999999999}` has a length at once)."""

    def __init__(self, span: range, width: int):
        self.span, self.width = span, width

    def __len__(self) -> int:
        return len(self.span)

    def __iter__(self):
        return (str(n).zfill(self.width) for n in self.span)


def _group_choices(match: re.Match) -> _Numbers | list[str] | None:
    """A brace group's words: a range of numbers (zero padding kept) or the comma alternatives; None
    for a group that is neither (`{abc}`, kept as written)."""
    body = match.group(1)
    numbers = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numbers:
        first, last = (int(n) for n in numbers.groups())
        width = len(numbers.group(1)) if body.startswith("0") else 0
        span = range(first, last + 1) if last >= first else range(first, last - 1, -1)
        return _Numbers(span, width)
    return body.split(",") if "," in body else None


def expand_braces(pattern: str, limit: int = MAX_SHARDS) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar (zero padding kept); `{a,b}` -> each.

    The names are counted before any is made (the product of the groups' sizes; nested groups, one
    step at a time): past `limit`, a ValueError says how many, so a pattern never expands beyond it."""
    pieces, at = [], 0
    for match in _BRACES.finditer(pattern):
        words = _group_choices(match)
        pieces += [[pattern[at:match.start()]], words if words is not None else [match.group(0)]]
        at = match.end()
    pieces.append([pattern[at:]])
    if any("{" in piece[0] or "}" in piece[0] for piece in pieces[::2]):
        return _expand_nested(pattern, limit)
    total = math.prod(len(words) for words in pieces)
    if total > limit:
        raise ValueError(f"{pattern!r} expands to {total:,} paths, more than {limit:,}")
    return ["".join(parts) for parts in itertools.product(*pieces)]


def _expand_nested(pattern: str, limit: int) -> list[str]:
    """Braces within braces (`{x{1..2},y}`): the innermost group first, then the pattern again, one
    step at a time, each step counted before it is made; first, the product of every group's size
    (what the steps multiply to) refuses a pattern past the limit at once."""
    bound = math.prod(_nested_sizes(pattern))
    if bound > limit:
        raise ValueError(f"{pattern!r} expands to up to {bound:,} paths, more than {limit:,}")
    pending: list[tuple[str, int | None]] = [(pattern, 0)]  # (text, where its next group may start; None: done)
    while any(start is not None for _, start in pending):
        steps = []
        for text, start in pending:
            match = _BRACES.search(text, start) if start is not None else None
            steps.append((match, _group_choices(match) if match else None))
        total = sum(len(words) if words is not None else 1 for _, words in steps)
        if total > limit:
            raise ValueError(f"{pattern!r} expands to more than {limit:,} paths (at least {total:,})")
        following: list[tuple[str, int | None]] = []
        for (text, _), (match, words) in zip(pending, steps):
            if match is None:
                following.append((text, None))
            elif words is None:  # `{abc}` is kept as written; look past it
                following.append((text, match.end()))
            else:
                head, tail = text[:match.start()], text[match.end():]
                following += [(head + word + tail, 0) for word in words]
        pending = following
    return [text for text, _ in pending]


def _nested_sizes(pattern: str) -> list[int]:
    """Each brace pair's number of words, read from the raw text: a range's length, else its commas
    outside inner pairs plus one."""
    sizes, opened = [], []  # opened: [start, commas at its level] of each pair not yet closed
    for at, char in enumerate(pattern):
        if char == "{":
            opened.append([at, 0])
        elif char == "," and opened:
            opened[-1][1] += 1
        elif char == "}" and opened:
            start, commas = opened.pop()
            numbers = re.fullmatch(r"(\d+)\.\.(\d+)", pattern[start + 1:at])
            sizes.append(abs(int(numbers.group(2)) - int(numbers.group(1))) + 1 if numbers else commas + 1)
    return sizes


def shard_paths(patterns: Sequence[str], key: str, source: str, objects: dict[str, remote.ObjectInfo] | None = None,
                client: remote.Client | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """(the shards, in the order given, each once; (pattern, reason) of each that names no file).
    URLs of an object store are looked up there with `client` (a listing per folder, globs too);
    `objects` gets their sizes and ETags."""
    shards, missing, seen = [], [], set()
    urls: list[str] = []  # named one by one: looked up together, in parallel, after the patterns
    objects = {} if objects is None else objects
    for pattern in patterns:
        try:
            expansions = expand_braces(pattern, MAX_SHARDS - len(shards) - len(missing) - len(urls))
        except ValueError as error:
            raise ConfigError(f"{source}: {key}: {error}; a split takes at most {MAX_SHARDS:,} shards. Check the "
                              f"brace range (`train-{{000000..000146}}.tar`)") from None
        for expanded in expansions:
            if remote.is_url(expanded):
                found = _remote_matches(expanded, objects, missing, urls, client)
            elif not glob.has_magic(expanded):  # a missing shard is named, never read nor indexed
                found = [expanded] if os.path.lexists(expanded) else []
                if not found:
                    missing.append((expanded, "missing (no such file)"))
            else:  # the index beside each shard (`.idx`) is never a shard itself
                found = sorted(path for path in glob.glob(expanded) if not path.endswith(INDEX_SUFFIX))
                if not found:
                    missing.append((expanded, "no file matches this pattern"))
            for path in found:
                if os.path.isdir(path):
                    raise ConfigError(f"{source}: {key}: {path!r} is a folder; list the shard files, e.g. "
                                      f"{os.path.join(path, 'train-{000000..000099}.tar')!r} or "
                                      f"{os.path.join(path, '*.tar')!r}")
                if path not in seen:
                    seen.add(path)
                    shards.append(path)
    if urls:
        named = client.stat_many(urls)
        for url, found in named.items():
            if isinstance(found, remote.ObjectInfo):
                objects[url] = found
            elif isinstance(found, FileNotFoundError):
                missing.append((url, "missing (no such object)"))
            else:
                raise found
        shards = [path for path in shards if not remote.is_url(path) or path in objects]
    if shards and any(remote.is_url(path) for path in shards) and not all(remote.is_url(path) for path in shards):
        local = next(path for path in shards if not remote.is_url(path))
        stored = next(path for path in shards if remote.is_url(path))
        raise ConfigError(f"{source}: {key}: the split mixes shards in an object store ({stored}) with local ones "
                          f"({local}); a split reads from one or the other: upload the local shards, or copy the "
                          f"others to a local disk")
    return shards, missing


def _remote_matches(url: str, objects: dict[str, remote.ObjectInfo], missing: list[tuple[str, str]],
                    urls: list[str], client: remote.Client) -> list[str]:
    """A glob's objects (listed now, into `objects`), or the URL itself, to be looked up with the others."""
    if not remote.has_magic(url):
        urls.append(url)
        return [url]
    try:  # a key may hold '?', '*' or '[' (S3 allows them): an object of that very name is that object
        objects[url] = client.stat(url)
        return [url]
    except FileNotFoundError:
        pass
    found = [info for info in client.glob(url) if not info.url.endswith(INDEX_SUFFIX)]
    if not found:
        missing.append((url, "no object matches this pattern"))
    objects.update((info.url, info) for info in found)
    return [info.url for info in found]


def index_split(config: Config, split: SplitConfig) -> SampleIndex:
    """The split's samples from its shards; what cannot be a sample follows dataset.on_bad_image."""
    key, source = f"{split.name}.shards", config.origin(f"{split.name}.shards")
    _check_split_keys(config, split, key, source)
    shards, missing, objects, excluded, root = listed_files(config, split.shards, key, "shard")
    extensions = tuple(e.lower().lstrip(".") for e in config.dataset.extensions)
    client = client_of(config) if objects else None
    scans = _scans(shards, extensions, [objects[url] for url in shards] if objects else None, client)
    names = config.dataset.classes or _classes_beside(shards, client)
    builder, ranges, problems = _samples(shards, scans, root, names, excluded)
    problems += [(path, f"shard {reason}") for path, reason in missing if not excluded(path)]
    if not len(builder):
        first = f" (the first problem: {problems[0][0]}: {problems[0][1]})" if problems else ""
        raise BadImageError(f"{source}: {key}: no usable sample in {plural(len(shards), 'shard')}{first}; a "
                            f"sample is a {{key}}.jpg member with its {{key}}.cls label")
    classes = names or tuple(str(i) for i in range(int(builder.labels().max()) + 1))
    unusable = config.on_bad_image.refuse(problems, noun="shards or members")
    log.info("indexed %s of split '%s'%s: %s in %s%s%s", plural(len(shards), "shard"), split.name,
             f" ({root})" if objects else "", plural(len(builder), "sample"), plural(len(classes), "class"),
             f", {plural(len(unusable), 'member')} left out" if unusable else "",
             f", {excluded.count} left out by dataset.exclude" if excluded.count else "")
    return builder.build(root, classes, excluded=excluded.count, ranges=ranges, unusable=unusable)


class Listed(NamedTuple):
    files: list[str]
    """The files to read, in the order named, each once, less those dataset.exclude lists."""
    missing: list[tuple[str, str]]
    """(pattern, reason) of each that names no file."""
    objects: dict[str, remote.ObjectInfo]
    """What the store says of each file in an object store (size, ETag)."""
    excluded: "Excluded"
    """dataset.exclude, counting what it left out."""
    root: str
    """The folder (or URL) the files share: their names are relative to it."""


def listed_files(config: Config, patterns: Sequence[str], key: str, noun: str) -> Listed:
    """A split's container files (tar shards, parquet files) as its key names them: looked up (in a
    store through the client of the config's dataset.remote), those in
    dataset.exclude left out (never read). A ConfigError names the key where none is found, or every one is excluded."""
    source = config.origin(key)
    stored = any(remote.is_url(pattern) for pattern in patterns)
    objects: dict[str, remote.ObjectInfo] = {}
    try:
        found, missing = shard_paths(patterns, key, source, objects, client_of(config) if stored else None)
    except remote.OddPath as error:  # the store's words on the URL: with the key that gave it
        raise ConfigError(f"{source}: {key}: {error}") from None
    if not found:
        raise ConfigError(f"{source}: {key}: no {noun} found ({missing[0][0]!r}: {missing[0][1]}); "
                          f"{_relative_to(config, noun) if not stored else _store_hint(missing[0][0])}")
    excluded = Excluded(config)
    kept = [path for path in found if not excluded(path)]  # a whole file in dataset.exclude is not read
    if not kept:
        raise ConfigError(f"{source}: {key}: every {noun} is listed in dataset.exclude "
                          f"({config.dataset.exclude}); remove them from the list or from {key}")
    excluded.count += len(found) - len(kept) + sum(1 for path, _ in missing if excluded(path))
    root = remote.common_root(kept) if objects else os.path.commonpath([os.path.dirname(path) for path in kept])
    return Listed(kept, missing, objects, excluded, root)


CLASSES_FILE = "{prefix}-classes.txt"
"""The class names of shards `{prefix}-000000.tar` ..., in label order, one a line, beside them: what
`fastloader pack` writes and the loader reads when dataset.classes is not set."""
_NUMBERED = re.compile(r"-\d+\.tar$")


def classes_file(shard: str) -> str:
    """Where the class names of a shard `dir/{prefix}-000000.tar` are: `dir/{prefix}-classes.txt`."""
    prefix = _NUMBERED.sub("", os.path.basename(shard))
    return os.path.join(os.path.dirname(shard), CLASSES_FILE.format(prefix=prefix))


def _classes_beside(shards: list[str], client: remote.Client | None) -> tuple[str, ...] | None:
    """The class names in the one classes file beside every shard of the split, or None."""
    files = {classes_file(shard) for shard in shards if _NUMBERED.search(shard)}
    if len(files) != 1 or not all(_NUMBERED.search(shard) for shard in shards):
        return None
    path = files.pop()
    try:
        names = _read_remote_class_names(path, client) if remote.is_url(path) else read_class_names(path)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        log.warning("%s beside the shards cannot serve as class names (%s); the classes are the labels' numbers. "
                    "Set dataset.classes to name them", path, error)
        return None
    log.info("class names from %s (beside the shards, as fastloader pack writes them): %s", path,
             ", ".join(names[:5]) + (" ..." if len(names) > 5 else ""))
    return names


def _read_remote_class_names(url: str, client: remote.Client) -> tuple[str, ...]:
    """read_class_names of an object (the classes file uploaded beside the shards)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".txt") as copy:
        copy.write(client.read_object(url))
        copy.flush()
        return read_class_names(copy.name)


def _store_hint(url: str) -> str:
    return (f"check the URL, and the store's environment ({remote.kind(url)}:// reads "
            f"{remote.credentials_words(url)})")


def _relative_to(config: Config, noun: str) -> str:
    """What relative paths of shards (or files) were read against, for a message."""
    if config.origin("dataset.root") == DEFAULT_ROOT_ORIGIN:
        return f"relative {noun} paths are relative to the config file's folder, or to dataset.root when it is set"
    return (f"relative {noun} paths are relative to dataset.root ({config.dataset.root}, from "
            f"{config.origin('dataset.root')})")


def _check_split_keys(config: Config, split: SplitConfig, key: str, source: str) -> None:
    if split.file_list or split.folder:
        other = "file_list" if split.file_list else "folder"
        raise ConfigError(f"{config.origin(f'{split.name}.{other}')}: {split.name}.{other}: dataset.format: "
                          f"webdataset reads the split from {key}; remove {split.name}.{other}, or set "
                          f"dataset.format: folder")
    if not split.shards:
        raise ConfigError(f"{source}: {key}: missing; dataset.format: webdataset reads each split from its tar "
                          f"shards, e.g. {split.name}: {{shards: '{split.name}-{{000000..000009}}.tar'}}")


class Excluded:
    """dataset.exclude for shards: whether a shard or `shard.tar:member` is listed (relative to
    dataset.root, as `check --exclude-list` writes it), and how many were left out."""

    def __init__(self, config: Config):
        self.root = config.dataset.root
        self.names = read_exclude_list(config.dataset.exclude, self.root) if config.dataset.exclude else frozenset()
        self.count = 0

    def __call__(self, name: str) -> bool:
        if not self.names:
            return False
        if remote.is_url(name):  # listed by URL, or relative to a dataset.root that is a URL
            return name in self.names or remote.relative(name, self.root) in self.names
        return os.path.normpath(os.path.relpath(name, self.root)) in self.names


def _samples(shards: list[str], scans: list[ShardScan], root: str, classes: Sequence[str] | None,
             excluded: Excluded) -> tuple[IndexBuilder, ByteRanges, list[tuple[str, str]]]:
    """The shards' samples as index rows (`shard.tar:member` names relative to root, labels) and
    byte ranges; and (name, reason) of each shard or member that cannot be a sample."""
    builder, problems = IndexBuilder(), []
    file, start, length, header = array("i"), array("q"), array("q"), array("q")
    for number, (path, scan) in enumerate(zip(shards, scans)):
        name = remote.relative(path, root) if remote.is_url(path) else os.path.relpath(path, root)
        problems += [(f"{path}:{member}" if member else path, reason if member else f"shard {reason}")
                     for member, reason in scan.problems if not excluded(f"{path}:{member}" if member else path)]
        for sample in scan.samples:
            if excluded(f"{path}:{sample.member}"):
                excluded.count += 1
                continue
            label, reason = _label(sample, classes)
            if reason:
                problems.append((f"{path}:{sample.member}", reason))
                continue
            builder.add(f"{name}:{sample.member}", label)
            file.append(number)
            start.append(sample.start)
            length.append(sample.length)
            header.append(sample.header)
    ranges = ByteRanges(tuple(shards), np.array(file, dtype=np.int32), np.array(start, dtype=np.int64),
                        np.array(length, dtype=np.int64), np.array(header, dtype=np.int64),
                        tuple(scan.identity for scan in scans))
    return builder, ranges, problems


def _label(sample: ShardSample, classes: Sequence[str] | None) -> tuple[int, str | None]:
    """(label, None), or (-1, why the sample has none)."""
    text, kind = sample.label_text, sample.label_kind
    if kind is None:
        return -1, f"no label: key {sample.key!r} has no .cls member (or .txt / .json with dataset.classes)"
    value: object = text.strip() if text is not None else ""
    if kind == "json":
        try:
            value = json.loads(text or "")
        except ValueError:
            return -1, f"label member {sample.key}.json is not JSON: {text[:40]!r}"
        if isinstance(value, dict):
            value = next((value[k] for k in ("cls", "label", "class") if k in value), None)
    if kind == "cls" or isinstance(value, int):
        try:
            label = int(value)
        except (TypeError, ValueError):
            return -1, f"label member {sample.key}.{kind} holds {str(value)[:40]!r}, not an integer class number"
        return label, label_problem(label, classes, f"{sample.key}.{kind}")
    if classes is None:
        return -1, (f"label member {sample.key}.{kind} names a class ({str(value)[:40]!r}); set dataset.classes to "
                    f"the class names in label order to read it")
    if value not in classes:
        return -1, f"label member {sample.key}.{kind} names {str(value)[:40]!r}, which is not in dataset.classes"
    return list(classes).index(value), None


def _scans(shards: list[str], extensions: tuple[str, ...], objects: list[remote.ObjectInfo] | None = None,
           client: remote.Client | None = None) -> list[ShardScan]:
    """Each shard's scan, from the split's cache file where the shard is unchanged, else read now:
    a local shard in worker processes, a shard in an object store (`objects`: what the store says of
    each) by ranged requests from threads."""
    cache = cache_home() / "shards" / (hashlib.blake2b("\0".join([*extensions, *shards]).encode(
        "utf-8", "surrogateescape"), digest_size=8).hexdigest() + ".json")
    cached = _read_cache(cache)
    if objects is None:
        scans: list[ShardScan | None] = [entry if entry is not None and _unchanged(path, entry) else None
                                         for path, entry in ((path, cached.get(path)) for path in shards)]
    else:  # keyed by (URL, size, ETag); an index found stale since is checked this time
        scans = [entry if entry is not None and (entry.size, entry.etag) == (info.size, info.etag) and
                 not (entry.labels and stale_index_marker(info.url, info.etag).exists()) else None
                 for entry, info in ((cached.get(info.url), info) for info in objects)]
    stale = [path for path, scan in zip(shards, scans) if scan is None]
    if stale:
        started = time.perf_counter()
        if objects is not None:
            by_url = {info.url: info for info in objects}
            progress = Progress(len(stale), "shards") if len(stale) > 1 else None
            scan = functools.partial(_scan_remote, extensions=extensions, client=client)
            read = dict(zip(stale, remote.in_parallel(scan, [by_url[url] for url in stale],
                                                      progress.update if progress else None)))
        else:
            progress = Progress(len(stale), "shards") if len(stale) > IN_PROCESS_UP_TO else None
            workers = min(available_cores(), len(stale)) if len(stale) > IN_PROCESS_UP_TO else 0
            read = dict(zip(stale, map_chunks(_scan_chunk, stale, (extensions,), workers=workers, chunk=1,
                                              in_flight=2, fork=False,
                                              on_progress=progress.update if progress else None)))
        if progress:
            progress.finish()
        scans = [scan if scan is not None else read[path] for path, scan in zip(shards, scans)]
        log.info("read the headers of %s in %.2fs (%s; cached in %s)", plural(len(stale), "shard"),
                 time.perf_counter() - started, plural(sum(len(read[path].samples) for path in stale), "sample"),
                 cache)
        _write_cache(cache, {path: scan for path, scan in zip(shards, scans) if scan.size})
    return scans


def _unchanged(path: str, scan: ShardScan) -> bool:
    """The shard is the file that was indexed: the same inode, size, mtime and ctime, and the same
    first and last bytes (one open and two small reads)."""
    try:
        if stat_stamp(os.stat(path)) != scan.stamp():
            return False
        fd = open_regular(path)
        try:
            return edge_digest(fd, scan.size) == scan.digest
        finally:
            os.close(fd)
    except OSError:
        return False


def _scan_chunk(paths: list[str], extensions: tuple[str, ...]) -> list[ShardScan]:
    return [scan_shard(path, extensions) for path in paths]


def _scan_remote(info: remote.ObjectInfo, extensions: tuple[str, ...], client: remote.Client) -> ShardScan:
    """A shard in an object store, scanned without downloading it: the index beside it (`.idx`)
    where there is one that matches it, else its tar headers, by ranged requests (a few a member).
    The index's labels are checked against the shard's whole copy when it is first read (its
    labels digest); where that found it stale (its labels, or its byte ranges), its label members
    and every member's header are read here first."""
    scan = ShardScan(info.size, info.mtime_ns, etag=info.etag)
    reader = remote.RangeFile(info, client)
    check_labels = stale_index_marker(info.url, info.etag).exists()  # a request a label member, this once
    try:
        scan.digest = edge_digest_of(reader.pread, info.size)
        try:
            beside = client.read_object(info.url + INDEX_SUFFIX)
        except FileNotFoundError:
            beside = None
        scan_file(reader, reader.pread, scan, extensions, info.url, beside, check_labels=check_labels,
                  check_headers=check_labels)
    except FileNotFoundError:
        return ShardScan(0, 0, problems=[("", "missing (no such object)")])
    except remote.Changed:
        return ShardScan(0, 0, problems=[("", "changed while it was indexed (its ETag); index it again")])
    except tarfile.TarError as error:
        return ShardScan(0, 0, problems=[("", f"unreadable: {error}")])
    return scan


def _read_cache(cache) -> dict[str, ShardScan]:
    try:
        data = json.loads(cache.read_text())
        if data.get("version") != INDEX_VERSION:
            return {}
        return {path: ShardScan(entry["size"], entry["mtime_ns"], [ShardSample(*row) for row in entry["samples"]],
                                [tuple(problem) for problem in entry["problems"]], entry["inode"], entry["ctime_ns"],
                                entry["digest"], entry.get("etag", ""), entry.get("labels", ""))
                for path, entry in data["shards"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write_cache(cache, scans: dict[str, ShardScan]) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    shards = {path: {"size": scan.size, "mtime_ns": scan.mtime_ns, "inode": scan.inode, "ctime_ns": scan.ctime_ns,
                     "digest": scan.digest, "etag": scan.etag, "labels": scan.labels,
                     "problems": scan.problems,
                     "samples": [[s.key, s.member, s.start, s.length, s.label_kind, s.label_text, s.header]
                                 for s in scan.samples]}
              for path, scan in scans.items()}
    partial = cache.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"version": INDEX_VERSION, "shards": shards}, separators=(",", ":")))
    os.replace(partial, cache)


register_format(Format("webdataset", indexed(index_split), keys=("shards",), containers=True, remote=True,
                       needs_root=False))
