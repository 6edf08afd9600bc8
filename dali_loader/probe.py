"""Find the files that made a DALI pipeline fail, one file at a time.

Why: DALI reports that an operator failed for a batch, and the pipeline is then unusable, but the
batch (and those DALI had started after it) may hold a hundred files. Each suspect is first given
the header check (missing, unreadable, truncated ...: a clear reason), then read and decoded alone
by a one-sample pipeline with the same decoder on the same device. Those that fail are the culprits.
"""
from __future__ import annotations

import logging
import re

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

from fastloader.imaging.screen import screen_file
from fastloader.schema import Config
from fastloader.sources.reading import Location, read_bytes

from .pipeline import decoder_options

log = logging.getLogger("fastloader")


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
    """Decodes single files (or shard members) with the pipeline's decoder; `problem(where)` is None
    for a good one. The probe is fed the encoded bytes, whatever the loader feeds."""

    def __init__(self, config: Config, device_id: int | None):
        self.config, self.device_id = config, device_id
        self._pipe: Pipeline | None = None

    def problem(self, where: str | Location) -> str | None:
        screened = screen_file(where, self.config.dataset.max_pixels)
        if screened.problem:
            return screened.problem
        if self._pipe is None:
            self._pipe = self._build()
        try:
            encoded = np.frombuffer(read_bytes(where), dtype=np.uint8)
        except OSError as error:
            return f"unreadable: {error.strerror or error}"
        self._pipe.feed_input("encoded", [encoded])
        try:
            self._pipe.run()
        except RuntimeError as error:
            self._pipe = None  # a failed pipeline cannot run again
            return f"DALI cannot decode it: {dali_reason(error)}"
        return None

    def _build(self) -> Pipeline:
        gpu = self.device_id is not None
        pipe = Pipeline(batch_size=1, num_threads=1, device_id=self.device_id, prefetch_queue_depth=1)
        with pipe:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            pipe.set_outputs(fn.decoders.image(encoded, output_type=types.RGB,
                                               adjust_orientation=self.config.dataset.exif_orientation,
                                               **decoder_options(gpu, self.config.dali.hw_decoder_load)))
        pipe.build()
        return pipe
