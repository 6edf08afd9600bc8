"""Each sample's upright (height, width) as screening read it, against the size the feed reads.

Why: the DALI feed draws each crop box (train) and centre box (eval) on the host from the image's
upright size, read from the header of the very bytes it feeds (fastloader.decoding.screen.read_screened),
so a box always fits the image DALI decodes. Screening read every file's size when the loader was
built (fastloader/screening.py); a file whose size differs now was changed since, and is named once.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fastloader.decoding.screen import Screened
from fastloader.decoding.sizes import upright


class Kept(NamedTuple):
    now: tuple[int, int]
    """The upright (height, width) of the bytes fed."""
    held: tuple[int, int] | None
    """The size screening read, where it differs (the file changed since); else None."""


class SizeTable:
    """Sample -> the upright (height, width) last known: screening's, then what the feed read."""

    def __init__(self, count: int, exif: bool, stored: np.ndarray | None = None):
        self.exif = exif
        self.sizes = np.zeros((count, 2), dtype=np.int64) if stored is None else upright(stored, exif)
        """int64 [count, 2]; 0: not known (the split was not screened)."""

    def keep(self, sample: int, screened: Screened) -> Kept:
        """The upright size of a sample's bytes as the feed checked them, kept; with the size held
        before where it differs."""
        height, width = screened.height, screened.width
        now = (width, height) if self.exif and screened.turned else (height, width)
        held = tuple(self.sizes[sample].tolist())
        if held == now:
            return Kept(now, None)
        self.sizes[sample] = now
        return Kept(now, held if held[0] else None)

    def keep_all(self, samples: np.ndarray, now: np.ndarray) -> list[tuple[int, tuple[int, int]]]:
        """`keep` of a batch's samples (int64 [n, 2] upright sizes now), by whole columns: (row, size
        held before) of each whose size screening read differs."""
        held = self.sizes[samples]
        changed = np.flatnonzero((held != now).any(axis=1))
        if not len(changed):
            return []
        self.sizes[samples[changed]] = now[changed]
        named, found = set(), []
        for row in changed.tolist():  # a sample twice in the batch is named once, as `keep` names it
            if held[row, 0] and int(samples[row]) not in named:
                named.add(int(samples[row]))
                found.append((row, tuple(held[row].tolist())))
        return found
