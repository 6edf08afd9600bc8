"""The Source protocol: what fastloader needs of anything that holds a split's images, whether one
of its own formats (a folder, a file list, tar shards, parquet or Arrow files) or the user's (a
SQLite table, a blob service, a map-style torch Dataset).

A source must give:

    name: str                   how messages name it (a file, a URL, a table)
    samples() -> Samples        every sample's name, its label, and the class names; called once,
                                when a loader is built (the index then stays as it was)
    read(item) -> bytes         sample `item`'s encoded image (JPEG, PNG ...: bytes, bytearray,
                                memoryview), or a decoded one (a uint8 HWC numpy array, a PIL
                                image, a uint8 CHW or HWC tensor), which costs region decode and nvJPEG;
                                it works whether or not samples() was called in this process (a
                                worker may read first), as SPDL's keys + load
    identity() -> str           what changes when its contents change: screening and the uint8
                                cache are kept per identity

and may give:

    __len__() -> int            its length now: checked at every epoch, so that a source that grew
                                or shrank under a running loader is named, not misread

fastloader's own formats are Sources too (registry.IndexedSource); the loader takes their index of
byte ranges (Locations read with pread, checked against what was indexed, with containers for
`shuffle: block` and the node cache) straight from them, which no user's source needs to give.

Everything past `samples()` reads through `read` (reading.read_bytes dispatches on the Location,
whose `source` names an opened source): screening, both backends, the uint8 cache, `check`,
`show` and `pack`. An opened source is kept in this process's table under a token (a string), so a
Location stays a small, picklable tuple and DataLoader workers, forked, find the same object.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, NamedTuple, Protocol, Sequence, runtime_checkable

from ..errors import SourceReadError

REQUIRED = ("name", "samples", "read", "identity")
"""What a source must have (`name` an attribute, the others methods)."""
OPTIONAL = ("__len__",)


class Samples(NamedTuple):
    """A source's samples: sample i is names[i] with labels[i], an index into classes."""
    names: Sequence[str]
    labels: Sequence[int]
    classes: Sequence[str]


@runtime_checkable
class Source(Protocol):
    """A source of samples (module docstring: what it must and may give)."""
    name: str

    def samples(self) -> Samples: ...

    def read(self, item: int) -> Any: ...

    def identity(self) -> str: ...


def missing_parts(source: object) -> list[str]:
    """What a would-be source lacks of the protocol: attribute names, `name` first ([] for a source)."""
    missing = [] if isinstance(getattr(source, "name", None), str) else ["name (a str)"]
    return missing + [f"{method}()" for method in REQUIRED[1:] if not callable(getattr(source, method, None))]


_opened: dict[str, object] = {}
_lock = threading.Lock()
_tokens = itertools.count()


def open_source(source: object) -> str:
    """A token for `source` in this process's table: what the Locations of its samples carry.
    Forked processes (DataLoader workers, cache writers) inherit the table."""
    with _lock:
        token = f"{next(_tokens)}:{getattr(source, 'name', '?')}"
        _opened[token] = source
    return token


def opened(token: str) -> object:
    """The source a token names; SourceReadError where this process has none (a process that was
    not forked from the one that built the loader)."""
    try:
        return _opened[token]
    except KeyError:
        raise SourceReadError(0, f"the source {token.partition(':')[2]!r} is not open in this process (it is "
                                 f"opened where the loader is built, and read there or in forked workers)") from None


def adopt_source(token: str, source: object) -> None:
    """Put a source in this process's table under the token its loader gave it: what a worker that
    was spawned (not forked: macOS, Windows) does with the source its dataset brought along."""
    with _lock:
        _opened.setdefault(token, source)


def forget_source(token: str) -> None:
    """Drop a source from the table once the loader that opened it is closed or dropped, so that
    the table does not keep every source a long process ever read. Its own close(), if any, is
    the caller's: a source given to build_loader may serve another loader."""
    with _lock:
        _opened.pop(token, None)
