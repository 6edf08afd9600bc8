"""Each sample's upright (height, width), which the DALI feed turns into its eval box on the host.

Why on the host: computing the box inside the DALI graph (peek_image_shape, then some twenty
arithmetic operators per batch) halved the GPU flavour's eval throughput (issue 16); the box is a
few float operations on two integers, so the feed computes a batch's boxes and passes them in.

Where the sizes come from: the screening pass that ran when the loader was built read every
file's header in parallel and kept each size with its result (fastloader/screening.py), so the
training thread reads none. Without a screening result (dataset.screen: false) a file's header is
read on the training thread the first time its sample is fed (fastloader.imaging.sizes, 10-20 us a
JPEG), and kept. A file that changed since it was screened is found, named and its size corrected:
by the pipeline's own header read (peek_image_shape, see loader.py) when its crop still fit, or
when the pipeline failed on a crop out of its new bounds (reread).
"""
from __future__ import annotations

import numpy as np

from fastloader.imaging.sizes import stored_size, upright
from fastloader.sources.reading import Location


class SizeTable:
    """Sample -> upright (height, width): from screening, else each read once on first use."""

    def __init__(self, count: int, exif: bool, stored: np.ndarray | None = None):
        self.exif = exif
        self.sizes = np.zeros((count, 2), dtype=np.int64) if stored is None else upright(stored, exif)
        """int64 [count, 2]; 0: not known yet (read on first use)."""

    def of(self, samples: np.ndarray, location_of) -> np.ndarray:
        """[len(samples), 2] sizes; `location_of(sample)`: where the bytes DALI decodes for a sample are.
        A file that cannot be read gets 1 x 1 for this batch (any box will do: DALI fails on it)."""
        sizes = self.sizes[samples]
        unknown = sizes[:, 0] == 0
        if unknown.any():
            for sample in samples[unknown].tolist():
                stored = stored_size(location_of(sample))
                if stored is not None:
                    self.sizes[sample] = upright(np.array([stored]), self.exif)[0]
            sizes = self.sizes[samples]
        return np.where(sizes == 0, 1, sizes)

    def correct(self, sample: int, size: tuple[int, int]) -> None:
        """The decoder saw another size than the table held (the file changed): keep the new one."""
        self.sizes[sample] = size

    def reread(self, sample: int, where: str | Location) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """Read the file's header again: (the size held, the size now) where they differ (the file
        changed since it was screened), after keeping the new one; else None."""
        stored = stored_size(where)
        if stored is None:
            return None
        now = tuple(upright(np.array([stored]), self.exif)[0].tolist())
        held = tuple(self.sizes[sample].tolist())
        if now == held:
            return None
        self.sizes[sample] = now
        return held, now
