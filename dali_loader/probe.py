"""Find the files that made a DALI pipeline fail.

Why: DALI reports that an operator failed for a batch, and the pipeline is then unusable, but the
batch (and those DALI had started after it) may hold a hundred files. Each suspect is first given
the header check (missing, unreadable, truncated ...: a clear reason). The rest are decoded the way
the loader's graph decodes them (pipeline.decode): in batches, with the same decoder on the same
device, in train mode only each sample's crop region, so that a failure seen only there (nvJPEG's
batched or hardware path, a region out of a file's bounds) is found too. A batch that fails is
halved until the files that fail alone are left: those are the culprits.
"""
from __future__ import annotations

import logging
import re
from typing import Callable

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

from fastloader.decoding.screen import screen_file
from fastloader.locations import Location
from fastloader.sources.reading import read_bytes

from .pipeline import DecodePlan, GraphSpec, decode

log = logging.getLogger("fastloader")

Regions = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""(sample, seed) rows -> their crop regions as the feed draws them: (x, y) corners, (width, height)."""

_OUT_OF_MEMORY = re.compile(r"out of memory|can't allocate|allocation failed|bad_alloc|ALLOCATOR_FAILURE", re.I)


def out_of_memory(error: BaseException) -> bool:
    """Whether an error says memory ran out (torch's OutOfMemoryError, MemoryError, DALI's "Can't
    allocate ... bytes on device", CUDA's "out of memory"): no file is to blame for it."""
    return isinstance(error, MemoryError) or bool(_OUT_OF_MEMORY.search(str(error)))


def dali_reason(error: Exception) -> str:
    """DALI's message boiled down to the operator and what it encountered, without the Python
    traceback it quotes and its 'pipeline object is no longer valid' coda."""
    text = str(error)
    operator = re.search(r"Error in (\w+) operator `([^`]+)`", text)
    detail = text.split("encountered:", 1)[1] if "encountered:" in text else text
    lines = [line.strip(" :") for line in detail.splitlines()]
    detail = " ".join(line for line in lines if line and "pipeline object is no longer valid" not in line
                      and not line.startswith("Critical error in pipeline"))
    where = f"{operator.group(2)} ({operator.group(1)}): " if operator else ""
    return (where + detail)[:600] or type(error).__name__


class DecodeProbe:
    """Decodes suspects with the pipeline's decoder: `culprits(batches, location)` maps each sample
    that cannot be used to why. Fed the encoded bytes, whatever the loader feeds; with `regions`
    (train, where the plan decodes regions), only each sample's crop region, as the train graph
    decodes it; `plan`: the graph's DecodePlan (chroma), so that a failure of that decode is found."""

    def __init__(self, spec: GraphSpec, max_pixels: int, device_id: int | None, batch_size: int, plan: DecodePlan,
                 regions: Regions | None = None):
        self.spec, self.max_pixels = spec, max_pixels
        self.device_id, self.batch_size, self.regions = device_id, batch_size, regions
        self.plan = plan
        self._pipe: Pipeline | None = None

    def culprits(self, batches: list[np.ndarray], location: Callable[[int], str | Location]) -> dict[int, str]:
        """sample -> reason, for the samples of these (sample, seed) batches that fail the header
        check, cannot be read, or fail to decode in their batch and then alone."""
        found: dict[int, str] = {}
        try:
            for plan in batches:
                kept, encoded = [], []
                for row, sample in enumerate(plan[:, 0].tolist()):
                    problem, data = self._read(location(sample))
                    if problem:
                        found[sample] = problem
                    else:
                        kept.append(row)
                        encoded.append(data)
                self._search(plan[kept], encoded, found)
        finally:
            self._pipe = None  # its buffers go before the loader builds its new pipeline
        return found

    def _read(self, where: str | Location) -> tuple[str | None, np.ndarray | None]:
        screened = screen_file(where, self.max_pixels)
        if screened.problem:
            return screened.problem, None
        try:
            return None, np.frombuffer(read_bytes(where), dtype=np.uint8)
        except OSError as error:
            return f"unreadable: {error.strerror or error}", None

    def _search(self, plan: np.ndarray, encoded: list[np.ndarray], found: dict[int, str]) -> None:
        """Decode the batch; where it fails, each half, down to single files."""
        if not len(plan):
            return
        error = self._decode(plan, encoded)
        if error is None:
            return
        if len(plan) == 1:
            found[int(plan[0, 0])] = f"DALI cannot decode it: {error}"
            return
        half = len(plan) // 2
        self._search(plan[:half], encoded[:half], found)
        self._search(plan[half:], encoded[half:], found)

    def _decode(self, plan: np.ndarray, encoded: list[np.ndarray]) -> str | None:
        """Why DALI cannot decode this batch (its reason, not the error, whose frames hold the failed
        pipeline), or None. Running out of memory blames no file: raised."""
        if self._pipe is None:
            self._pipe = self._build()
        self._pipe.feed_input("encoded", encoded)
        if self.regions is not None:
            anchor, shape = self.regions(plan)
            self._pipe.feed_input("anchor", anchor)
            self._pipe.feed_input("shape", shape)
        try:
            self._pipe.run()
        except Exception as error:
            self._pipe = None  # a failed pipeline cannot run again
            if out_of_memory(error):
                raise
            return dali_reason(error)
        return None

    def _build(self) -> Pipeline:
        pipe = Pipeline(batch_size=self.batch_size, num_threads=1, device_id=self.device_id, prefetch_queue_depth=1)
        with pipe:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            region = None
            if self.regions is not None:
                region = (fn.external_source(name="anchor", dtype=types.FLOAT),
                          fn.external_source(name="shape", dtype=types.FLOAT))
            pipe.set_outputs(decode(encoded, self.spec, self.device_id is not None, self.plan, region))
        pipe.build()
        return pipe
