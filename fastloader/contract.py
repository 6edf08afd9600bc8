"""The Loader contract both backends implement, and the behaviour they share.

Shared here, so that the backends cannot drift apart: which epoch a `for` loop runs, what `len`
means, the closed state, and the (epoch, batch) position that a resume restarts from.
"""
from __future__ import annotations

import abc
import logging
from typing import Iterator

import torch

from .config import Config, SplitConfig, config_to_dict
from .distributed import RankInfo
from .order import EpochOrder
from .samples import SampleIndex

log = logging.getLogger("fastloader")

STATE_VERSION = 1


class Loader(abc.ABC):
    """`for images, labels in loader`: images float [B, 3, H, W] normalized, labels int64 [B].

    Each `for` loop runs one epoch: the one given to `set_epoch`, else the one after the last
    started (0 first). Leaving a loop early with `break` is fine; the next loop starts afresh.
    """

    backend: str = "?"

    def __init__(self, config: Config, split: SplitConfig, index: SampleIndex, ranks: RankInfo,
                 device: torch.device):
        self.config, self.split, self.index, self.ranks = config, split, index, ranks
        self.device = device
        self.order = EpochOrder(len(index), split.batch_size, mode=split.mode, shuffle=split.shuffle,
                                drop_last=split.drop_last, seed=config.seed, rank=ranks.rank,
                                world_size=ranks.world_size)
        self._epoch = 0
        self._epoch_set = True  # the first loop runs epoch 0
        self._resume_batch = 0
        self._batches_done = 0  # in the current epoch: the resume position
        self._closed = False
        if self.order.num_batches == 0:
            log.warning("%s: split '%s' yields no batch per epoch on rank %d: %d samples, batch_size %d x "
                        "world_size %d with drop_last: true; lower %s.batch_size or set %s.drop_last: false",
                        config.source, split.name, ranks.rank, len(index), split.batch_size,
                        ranks.world_size, split.name, split.name)
        if self.order.padded:
            log.info("split '%s': %d samples repeated per epoch so that %d ranks yield equal batches",
                     split.name, self.order.padded, ranks.world_size)

    # -- the contract ----------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self.split.batch_size

    @property
    def num_samples(self) -> int:
        """Samples in the split (all ranks together)."""
        return len(self.index)

    @property
    def classes(self) -> tuple[str, ...]:
        return self.index.classes

    @property
    def epoch(self) -> int:
        return self._epoch

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return self.order.num_batches

    def set_epoch(self, epoch: int) -> None:
        """Make the next `for` loop run this epoch (its order is a function of seed and epoch)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch, self._epoch_set, self._resume_batch = int(epoch), True, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._closed:
            raise RuntimeError(f"this {self.backend} loader for split '{self.split.name}' is closed; "
                               f"build a new one with fastloader.build_loader(...)")
        if not self._epoch_set:
            self._epoch += 1
        self._epoch_set = False
        start, self._resume_batch = self._resume_batch, 0
        return self._run_epoch(self._epoch, start)

    def _run_epoch(self, epoch: int, start: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._batches_done = start
        for images, labels in self._iter_batches(self.order.batches(epoch, start)):
            self._batches_done += 1
            yield images, labels

    def state_dict(self) -> dict:
        """Where the trainer is: resuming from it yields exactly the batches not yet consumed."""
        return {"version": STATE_VERSION, "backend": self.backend, "split": self.split.name,
                "epoch": self._epoch, "batches_done": self._batches_done, "seed": self.config.seed,
                "num_samples": len(self.index), "world_size": self.ranks.world_size, "rank": self.ranks.rank}

    def load_state_dict(self, state: dict) -> None:
        """Make the next `for` loop continue the saved epoch after its last consumed batch."""
        expected = self.state_dict()
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')!r} is not {STATE_VERSION}")
        for key in ("backend", "split", "seed", "num_samples", "world_size"):
            if state.get(key) != expected[key]:
                raise ValueError(f"loader state was saved with {key}={state.get(key)!r}, this loader has "
                                 f"{key}={expected[key]!r}; resume with the same config and job size")
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        if done >= self.order.num_batches:  # saved at the end of an epoch: go on with the next
            epoch, done = epoch + 1, 0
        self._epoch, self._epoch_set = epoch, True
        self._resume_batch = self._batches_done = done

    def close(self) -> None:
        """Stop workers / free the pipeline. Iterating afterwards raises an error."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def describe(self) -> dict:
        """What this loader is, for logs and reports."""
        return {"backend": self.backend, "split": self.split.name, "device": str(self.device),
                "batches": len(self), "batch_size": self.batch_size, "num_samples": self.num_samples,
                "rank": self.ranks.rank, "world_size": self.ranks.world_size, "config": config_to_dict(self.config)}

    # -- what a backend provides -----------------------------------------------------------------

    @abc.abstractmethod
    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (images, labels) on self.device for these batches of (sample index, sample seed)."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release workers, pipelines and memory."""
