"""Every error fastloader raises on purpose, and the one wording of a file it refuses.

Why one module: the backends, the screening and the cache all refuse files, and a user who meets
one of these errors should read the same words wherever it came from, and find the type to catch
in one place. Messages name the file or config key and the way on.

Every one of them is a `FastloaderError` (`except fastloader.FastloaderError` catches whatever the
library says on purpose), and each keeps the built-in base a caller would have caught before: a
config's mistake is a ValueError, a bad file's read an OSError, a run that cannot go on a
RuntimeError. What stays a plain Python exception: a wrong argument type (TypeError), a missing
attribute (AttributeError), and the sampler's own preconditions (order.EpochOrder used directly).
"""
from __future__ import annotations

import re


class FastloaderError(Exception):
    """The root of every error fastloader raises on purpose."""


class ConfigError(FastloaderError, ValueError):
    """A config that cannot be used; the message names where (file or override), which key and why."""


class CacheError(ConfigError):
    """A cache that cannot serve this split: stale, unfinished, or of another format."""


class StoreError(FastloaderError, RuntimeError):
    """An object store or the node cache that cannot serve a shard: the store unreachable after the
    retries, the cache disk full, a shard evicted faster than it can be read. No sample's fault, so
    no backend skips a sample for it (NOT_A_SAMPLES_FAULT): the run stops, naming the URL. Not a
    ValueError: nothing in the config is wrong, and a retry later may pass."""


class LockTimeout(StoreError):
    """A node-cache lock held past its patience by a process that made no progress: named, with its holder."""


class BadImageError(FastloaderError, RuntimeError):
    """A file that cannot be decoded, under dataset.on_bad_image: raise."""


class HookError(FastloaderError, RuntimeError):
    """The user's own hook (a sample, batch or graph hook) raised, or gave what it must not: the
    user's bug, never a bad file's, so no backend skips a sample for it. The message names the hook,
    its key, the sample or batch, what was expected, and the hook's traceback."""


class AugmentError(FastloaderError, RuntimeError):
    """One of fastloader's own augmentation ops failed on a decoded crop: fastloader's bug, never the
    file's (a reflect pad wider than a tiny crop once listed good JPEGs as undecodable), so no
    backend skips a sample for it (NOT_A_SAMPLES_FAULT). The message names the ops, the crop's size
    and the sample."""


class SourceError(FastloaderError, RuntimeError):
    """A source's failure that is not one sample's (its database locked for good, its read() that
    tried to end the process): the run stops, naming the source and what to do, on either backend."""


class SourceReadError(FastloaderError, OSError):
    """A source's read() raised, or gave something that is not an image's bytes: the sample is
    unreadable (dataset.on_bad_image decides), and the message names the source and the sample."""

    def __str__(self) -> str:
        return str(self.strerror)


class SourceChanged(SourceError):
    """A source no longer holds what it held when the loader indexed it (its length, its identity, a
    sample's name or label at its number): every later read would be of another sample under this
    one's label, so the run stops, naming the source, on either backend; never a bad file's skip."""


class StateError(FastloaderError, ValueError):
    """A loader state (`load_state_dict`) that this loader cannot resume from: another version,
    backend, split, dataset, order or hooks, or a value out of its range; the message says which and
    what to pass instead."""


class LoaderError(FastloaderError, RuntimeError):
    """The loader cannot go on as asked: one of its decoding workers died or went silent, DALI's
    driver is stuck or stopped, it is closed, a newer loop took it over, or a forked process uses
    it. The message names the process or loop and what to do; the next loop starts afresh where it
    can."""


class DiskFullError(FastloaderError, OSError):
    """No room to write (ENOSPC, EDQUOT), found before writing or while writing; the message names
    the folder, the space needed and free, and nothing half-written is left."""


NOT_A_SAMPLES_FAULT = (CacheError, StoreError, SourceError, AugmentError)
"""Failures of the cache, the store, a source or an op, not of the sample being read: a backend that
skips bad samples re-raises these, since skipping would blame sample after sample."""


def error_text(error: BaseException) -> str:
    """An exception's message, or its type's name where it has none (`str(KeyError())` is '')."""
    return str(error) or type(error).__name__


_OBJECT_REPR = re.compile(r" ?<[\w.]+ object at 0x[0-9a-fA-F]+>")


def decoder_reason(error: BaseException) -> str:
    """A decoder's failure as a reason a person can read: its type and message, without the repr of
    the in-memory file it was given (Pillow's "cannot identify image file <_io.BytesIO object at
    0x7f...>"), which names nothing and differs on every run."""
    return f"{type(error).__name__}: {_OBJECT_REPR.sub('', str(error))}"


def refused_file(path: str, reason: str, source: str, context: str = "") -> str:
    """The one wording of a refused file: which, why, and the two ways on. `context` says where it
    was found or what it stopped, e.g. "listed as bad in the cache DIR" or "the cache was not built"."""
    found = f" ({context})" if context else ""
    return (f"cannot use image {path!r}: {reason}{found}. Set dataset.on_bad_image: skip in {source} to leave "
            f"such files out (each is logged once and listed in loader.bad_samples), or list it in "
            f"dataset.exclude (`fastloader check CONFIG --exclude-list FILE` writes the list)")


def add_note(error: BaseException, note: str) -> None:
    """Add a line to an error raised elsewhere, keeping its type and message: a note (PEP 678), shown
    under its traceback; before Python 3.11, which has no notes, appended to its message."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # pragma: no cover - Python 3.10
        error.args = (f"{error.args[0] if error.args else ''}\n{note}", *error.args[1:])
