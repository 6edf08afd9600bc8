"""After the DALI pipeline failed: find the files that broke it, and go on without them in a new
pipeline or stop naming them; a failure no file explains stops the loader (failures.py: the cases).

Never retries blindly, never hangs: DALI cannot go on after an operator failed, so the failed
pipeline is let go first, so that its buffers are free before the probe's and the new pipeline's
are taken (on a GPU, nvJPEG's). The probe (probe.py) decodes the batches DALI had been given the
way the graph decodes them.
"""
from __future__ import annotations

import itertools
import logging
import traceback
from typing import Callable

import numpy as np

from fastloader.errors import BadImageError, LoaderError, add_note, refused_file

from .failures import stopped_words
from .feed import Feed
from .inputs import InputPlan, batch_inputs
from .pipeline_life import PipelineLife
from .probe import DecodeProbe, dali_reason, out_of_memory
from .sizes import SizeTable

log = logging.getLogger("fastloader")


def crop_regions(inputs: InputPlan, sizes: SizeTable, plan: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Train: the crop regions (anchor, shape) the feed drew for these (sample, seed) rows, from
    the sizes of the bytes it fed (kept in its size table), which the probe decodes as the train
    graph does."""
    anchor, shape = batch_inputs(inputs, plan, plan, sizes.sizes[plan[:, 0]])[:2]
    return anchor, shape


class Recovery:
    """Stops the loader's pipeline on a failure, or finds the files that broke it (`new_probe()`)
    and rebuilds it without them; `name_of(sample)`: a sample's path; `skip`: dataset.on_bad_image
    is skip (else raise); `memory_hint()`: what to lower when memory ran out. Holds no reference to
    the loader, so that a dropped loader is freed at once."""

    def __init__(self, pipeline: PipelineLife, feed: Feed, new_probe: Callable[[], DecodeProbe],
                 name_of: Callable[[int], str], split_name: str, skip: bool, source: str,
                 memory_hint: Callable[[], str]):
        self.pipeline, self.feed, self.new_probe = pipeline, feed, new_probe
        self.name_of, self.split_name = name_of, split_name
        self.skip, self.source = skip, source
        self.memory_hint = memory_hint

    def stop(self, error: BaseException) -> BaseException:
        """A failure no bad file explains (a CUDA error, running out of memory, an error of the
        hand-over or the finisher, or one that is not DALI's) ends the loader: the pipeline's epoch
        is in no known state, so it is let go and later loops are refused. The error itself goes to
        the trainer, unchanged (out of memory: with a note on what to lower)."""
        self.pipeline.stop(stopped_words(self.split_name, error))
        if out_of_memory(error):
            add_note(error, self.memory_hint())
        return error

    def recover(self, error: RuntimeError, number: int, epoch: int) -> None:
        """DALI failed at batch `number` of `epoch`: probe the batches it had been given; rebuild the
        pipeline without the files that fail and feed it the unfinished batches again, or raise."""
        fed = list(self.feed.fed)  # the failed batch and those DALI had started after it
        traceback.clear_frames(error.__traceback__)  # the driver's frames in it hold the failed pipeline
        self.pipeline.let_go_failed()
        suspects = [batch.plan for batch in fed]
        probe = self.new_probe()
        try:
            culprits = probe.culprits(suspects, self.feed.reader.location)
        except BaseException as failure:  # out of memory, say: no file to blame, no pipeline left
            raise self.stop(failure) from error
        del probe  # its pipeline goes before the new one is built
        if not culprits:
            raise self._unexplained(error, number, epoch, suspects[0] if suspects else np.zeros((0, 2), np.int64))
        if not self.skip:
            first = min(culprits)
            why = refused_file(self.name_of(first), culprits[first], self.source)
            self.pipeline.stop(why)
            raise BadImageError(why) from error
        log.info("split '%s': the DALI pipeline failed at batch %d of epoch %d on %d files that cannot be decoded; "
                 "rebuilding it without them", self.split_name, number, epoch, len(culprits))
        self.feed.reader.bad.refuse(culprits)
        self.feed.new_arenas()
        again, rest = self.feed.unfinished(), self.feed.ahead.batches
        self.pipeline.rebuild()
        self.feed.start(itertools.chain(again, rest), self.feed.ahead.following)

    def _unexplained(self, error: RuntimeError, number: int, epoch: int, batch: np.ndarray) -> LoaderError:
        """No file fails: say where DALI failed, and refuse later loops clearly."""
        files = ", ".join(self.name_of(i) for i in batch[:3, 0]) + (" ..." if len(batch) > 3 else "")
        why = (f"the DALI pipeline of split '{self.split_name}' failed at batch {number} of epoch {epoch} (files "
               f"{files}, or a batch DALI had started after it), and these files decode, in their batches as the "
               f"pipeline decodes them and alone. DALI says: {dali_reason(error)[:1500]}. A DALI pipeline cannot "
               f"continue after an error: build a new loader")
        self.pipeline.stop(why)
        return LoaderError(why)
