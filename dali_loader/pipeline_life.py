"""A DALI loader's pipeline over its life: which loop owns it, whether an epoch is in it, the
driver thread running it, and why it stopped for good.

A pipeline runs one epoch at a time on a driver thread (driver.py). A loop left early leaves the
batches DALI prefetched in it: the next loop drains them and resets the pipeline (`end_epoch`),
since DALI's own iterator refuses an unfinished epoch (NVIDIA/DALI #1615). Each loop takes the
pipeline over by number (`take_over`); a loop that finds a newer number stops (a newer loop took
over, or the loader closed). After a failure DALI cannot go on: the pipeline is let go, and then
rebuilt (`rebuild`, recovery.py) or stopped for good (`stop`), later loops refused with why.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from .driver import Driver


class PipelineLife:
    """The pipeline that `build()` makes, run an epoch at a time by a driver thread. On a GPU,
    `stream` is the drivers' side stream, one for the loader's life: a new stream per epoch would
    strand the caching allocator's blocks cached on the old ones."""

    def __init__(self, build: Callable, device: torch.device):
        self.build = build
        self.pipe = build()
        self.built_in = os.getpid()
        """The process that built it: a forked child cannot run it, DALI's threads stay here."""
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.driver: Driver | None = None
        """The thread running the pipeline during an epoch."""
        self.epoch_in_pipeline = False
        """The pipeline holds batches of an epoch not yet drained: reset before the next."""
        self.owner = 0
        """The number of the loop that owns the pipeline; a loop whose number is older stops."""
        self.stopped_because = ""
        """Why the pipeline cannot run any more; empty while it can."""

    def refusal(self, split_name: str) -> str:
        """Why a new loop cannot run the pipeline; empty where it can."""
        if self.stopped_because:
            return self.stopped_because
        if os.getpid() != self.built_in:
            return (f"this DALI loader of split '{split_name}' was built in process {self.built_in} and inherited "
                    f"by this forked one, where DALI's threads do not run: build a new loader here "
                    f"(fastloader.build_loader)")
        return ""

    def take_over(self) -> int:
        """A new loop owns the pipeline: its number."""
        self.owner += 1
        return self.owner

    def start_epoch(self, drive: Callable[..., Driver]) -> None:
        """A driver thread, `drive(pipe, stream)`, runs the pipeline over what the feed was given."""
        self.epoch_in_pipeline = True
        self.driver = drive(self.pipe, self.stream)

    def end_epoch(self) -> None:
        """Stop feeding, drop the batches DALI prefetched (after a `break`) and rewind its epoch."""
        if not self.epoch_in_pipeline:
            return
        self.epoch_in_pipeline = False
        driver, self.driver = self.driver, None
        if driver is not None:
            try:
                driver.end_epoch()  # an error now belongs to an epoch nobody reads any more
            except RuntimeError as error:  # stuck inside DALI: the pipeline cannot be reset under it
                self.stopped_because, self.pipe = str(error), None
                raise
        self.pipe.reset()

    def let_go_failed(self) -> None:
        """After DALI failed: the failed pipeline goes now, with its buffers (on a GPU, nvJPEG's),
        before a probe's or a new pipeline's are taken."""
        self.epoch_in_pipeline = False
        self.pipe = None

    def rebuild(self) -> None:
        self.pipe = self.build()

    def stop(self, why: str) -> None:
        """Stopped for good: the pipeline's epoch is in no known state, so it is let go now, and
        later loops are refused, saying `why`."""
        self.epoch_in_pipeline = False
        self.pipe = None
        self.stopped_because = why

    def stop_after_draining(self, why: str) -> None:
        """Stopped for good on a file the user wants an error for: the epoch is ended as after a
        `break`, and later loops are refused, saying `why`."""
        self.stopped_because = why
        self.end_epoch()

    def let_go(self, wait: bool) -> bool:
        """Stop the driver and free the pipeline: DALI frees its threads and buffers when the
        pipeline is destroyed, here or, when the driver thread still holds it, as that thread ends.
        A loop still open ends (it finds a newer owner). `wait`: for that thread, where it can end
        meanwhile (driver.py); never from a finalizer. Whether no thread is left in the pipeline."""
        self.owner += 1
        self.epoch_in_pipeline = False
        driver, self.driver, self.pipe = self.driver, None, None
        if driver is not None:
            driver.close(wait)
        return driver.join(0) if driver is not None and wait else driver is None and not self.stopped_because
