"""fastloader in PyTorch Lightning: `DataModule(config)`, a LightningDataModule whose loaders are
fastloader's, built per rank in `setup()`, with the train loader's position in Lightning's
checkpoints (docs/lightning.md).

Why a wrapper at all: Lightning saves the state of a stateful train loader in its checkpoint (2.2+)
and restores it on `fit(ckpt_path=...)`, but a loader may have handed over a batch the model has not
trained on when the state is taken (Lightning's fit loop fetches ahead where a loader has no length;
a checkpoint taken in `on_train_batch_start` has the batch fetched): the loader's own position would
skip it on resume. The loader Lightning is given here reports the position of the batches the loop
has *processed* (its batch progress). Lightning also calls iter() before it calls set_epoch (and once
only to check that the loader iterates), so the loader's loop starts at its first batch, in the
epoch Lightning set through `sampler.set_epoch`, which keeps a resumed epoch's position. Lightning's sampler
injection (`use_distributed_sampler`) applies to torch DataLoaders only: fastloader's loaders shard
for torch.distributed themselves, so nothing is sharded twice.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Iterator, Mapping

import lightning.pytorch as pl

from . import build_loader
from .config import load_config
from .contract import Loader
from .errors import ConfigError
from .sources.formats import build_index

log = logging.getLogger("fastloader")


class _EpochSetter:
    """What Lightning finds at `loader.sampler`: set_epoch(epoch) at each epoch's start."""

    def __init__(self, loader: "LightningLoader"):
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


class LightningLoader:
    """A fastloader loader as Lightning's fit loop sees it: iterable, sized, stateful (its state is
    the position of the batches the loop has processed), with a sampler whose set_epoch Lightning
    calls. Everything else is the loader's (`.loader`)."""

    def __init__(self, loader: Loader, module: "DataModule"):
        self.loader, self.module = loader, module
        self.sampler = _EpochSetter(self)
        self._start = (0, 0)
        """(the loop's first sample, the fit loop's processed batches then): batches processed since
        count at this run's batch size, those before at the one the resumed state was saved with."""
        self._ended: int | None = None
        """A loaded state's epoch that has nothing left at this run's batch size (its last samples
        fill no whole batch): the loader resumes at the next epoch, the fit loop still finishes it."""
        self._nothing_left = False

    def __iter__(self) -> Iterator:
        """A loop of the loader that starts at its first batch: Lightning calls iter() before it
        calls set_epoch (and once more only to check that the loader iterates), so the loader's own
        loop, whose epoch is fixed when it starts, is started lazily."""
        if self._nothing_left:  # the fit loop's rest of an epoch the loader has finished: no batch
            self._nothing_left = False
            return
        self._start = (self.loader.resume_position, self._processed())
        yield from self.loader

    def _processed(self) -> int:
        trainer = self.module.trainer
        return trainer.fit_loop.epoch_loop.batch_progress.current.processed if trainer is not None else 0

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def set_epoch(self, epoch: int) -> None:
        """The trainer's epoch; a resumed epoch keeps the position its state gave, and one the state
        left nothing of gets an empty loop (set_epoch would start it again from its first batch)."""
        ended, self._ended = self._ended, None
        self._nothing_left = epoch == ended
        if self._nothing_left or (epoch == self.loader.epoch and self.loader.resume_position):
            return
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The loader's state at the batches the fit loop processed, not those it fetched, in samples:
        the loop's first sample (a resumed state's) and, from there, the batches processed since at
        this run's batch size (a run resumed with another batch size counts the batches before the
        resume, at the old size, as Lightning does: multiplying them by the new one skipped samples)."""
        state = self.loader.state_dict()
        trainer = self.module.trainer
        if trainer is not None and trainer.training:
            first, processed_then = self._start
            since = max(0, self._processed() - processed_then)
            state["epoch"] = trainer.current_epoch
            state["position"] = min(self.loader.order.advance(trainer.current_epoch, first, since),
                                    self.loader.order.epoch_length)
        return state

    def load_state_dict(self, state: dict) -> None:
        """The loader's position, and, where the state was saved with another batch size or world
        size, the fit loop's count of this epoch's batches set to what the position is in this
        run's batches: Lightning ends an epoch when its count reaches len(loader), so the batches
        counted at the old size would end it short of the epoch's last samples (or past them)."""
        self.loader.load_state_dict(state)
        saved_epoch = state.get("epoch")
        self._ended = saved_epoch if self.loader.next_epoch != saved_epoch else None
        trainer = self.module.trainer
        position = self.loader.resume_position
        same = (state.get("batch_size"), state.get("world_size")) == (self.loader.batch_size,
                                                                        self.loader.ranks.world_size)
        if trainer is None or not position or same:
            return
        done = max(0, len(self.loader) - len(self.loader.order.batches(self.loader.next_epoch, position)))
        current = trainer.fit_loop.epoch_loop.batch_progress.current
        log.info("split '%s': resumed at sample %d of epoch %d with batches of %d (the state's: %d): the fit loop's "
                 "count of the epoch's batches goes from %d to %d", self.loader.split.name, position,
                 self.loader.next_epoch, self.loader.batch_size, state.get("batch_size"), current.processed, done)
        shift = done - current.processed  # each counter moved alike: Lightning's own restart arithmetic still holds
        current.ready, current.started = current.ready + shift, current.started + shift
        current.processed, current.completed = current.processed + shift, current.completed + shift


class DataModule(pl.LightningDataModule):
    """`trainer.fit(model, datamodule=DataModule("configs/imagenette.yaml"))`: the config's train and
    val splits as fastloader loaders, built in `setup()` on each rank (after Lightning has started
    torch.distributed, which they shard for), closed in `teardown()`. `overrides` as build_loader's."""

    def __init__(self, config: Any, overrides: Mapping[str, Any] | list[str] | None = None,
                 train_split: str = "train", val_split: str | None = "val", **build_args: Any):
        super().__init__()
        self.config = load_config(config, overrides)
        self.train_split, self.val_split, self.build_args = train_split, val_split, build_args
        for name, key in ((train_split, "train_split"), (val_split, "val_split")):
            if name is not None and name not in self.config.splits:
                raise ConfigError(f"{self.config.source}: fastloader.lightning.DataModule({key}={name!r}): the config "
                                  f"has no split '{name}' (it has {', '.join(self.config.splits) or 'none'}); add a "
                                  f"'{name}:' section, or pass {key}=<one of them>"
                                  + (" or val_split=None to train without validation" if key == "val_split" else ""))
        self.train_loader: LightningLoader | None = None
        self.val_loader: Loader | None = None

    @functools.cached_property
    def classes(self) -> tuple[str, ...]:
        """The train split's class names, in label order (for the model's head, before the trainer
        builds the loaders): the split's index, read here once."""
        if self.train_loader is not None:
            return self.train_loader.classes
        return build_index(self.config, self.config.split(self.train_split)).classes

    def setup(self, stage: str | None = None) -> None:
        if stage in ("fit", None) and self.train_loader is None:
            trainer = self.trainer
            if trainer is not None and getattr(trainer._accelerator_connector, "use_distributed_sampler", False):
                log.debug("Lightning's use_distributed_sampler leaves fastloader's loaders alone (not DataLoaders): "
                          "they shard for torch.distributed themselves")
            self.train_loader = LightningLoader(build_loader(self.config, self.train_split, **self.build_args), self)
        if stage in ("fit", "validate", None) and self.val_split is not None and self.val_loader is None:
            self.val_loader = build_loader(self.config, self.val_split, **self.build_args)

    def train_dataloader(self) -> LightningLoader:
        return self.train_loader

    def val_dataloader(self) -> Loader | list:
        return self.val_loader if self.val_loader is not None else []

    def teardown(self, stage: str | None = None) -> None:
        for loader in (self.train_loader, self.val_loader):
            if loader is not None:
                loader.close()
        self.train_loader = self.val_loader = None
