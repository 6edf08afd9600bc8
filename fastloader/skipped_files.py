"""The files a loader skips under dataset.on_bad_image: skip, recorded once for loader.bad_samples
and counted per epoch, and what is said of them: the file's line, the epoch's line, the empty
batch's line and the error of an epoch that read nothing.
"""
from __future__ import annotations

import logging

from .errors import BadImageError
from .words import plural

log = logging.getLogger("fastloader")


class SkippedFiles:
    """The bad-sample record of one loader: every file listed once, with the reason it first gave."""

    def __init__(self, backend: str, split: str, rank: int, train: bool):
        self._backend, self._split, self._rank, self._train = backend, split, rank, train
        self.samples: list[tuple[str, str]] = []
        """(path, reason) of every file skipped so far: loader.bad_samples."""
        self._paths: set[str] = set()
        self.in_epoch: set[str] = set()
        """Files that failed at decode time in the current epoch."""
        self._found_in_epoch = 0  # of them, those no earlier epoch had met
        self._empty_batches = 0  # batches yielded empty because none of their files decodes

    def add(self, path: str, reason: str) -> bool:
        """Add the file to the record unless it is there already; whether it was new."""
        if path in self._paths:
            return False
        self._paths.add(path)
        self.samples.append((path, reason))
        return True

    def skip(self, path: str, reason: str) -> None:
        """A file that failed at decode time (its slot refilled in train mode, left out in eval):
        listed and logged once, counted once per epoch."""
        self.in_epoch.add(path)
        if self.add(path, reason):
            self._found_in_epoch += 1
            log.warning("skipped %s: %s (dataset.on_bad_image: skip; listed in loader.bad_samples)", path, reason)

    def new_epoch(self) -> None:
        """A loop starts: a loop left with `break` does not carry its epoch's counts over."""
        self.in_epoch, self._found_in_epoch = set(), 0

    def nothing_read(self, epoch: int) -> BadImageError:
        """An epoch that read no sample: an error, not batches of nothing to train on. Said where it is
        clear, the first train batch that stays empty (every slot's file and substitutes failed) or an
        eval epoch's end, with what failed first."""
        failed = [(path, reason) for path, reason in self.samples if path in self.in_epoch]
        path, reason = failed[0] if failed else ("?", "?")
        return BadImageError(
            f"{self._backend} loader, split '{self._split}', epoch {epoch}, rank {self._rank}: no sample could "
            f"be read ({plural(len(self.in_epoch), 'sample')} failed so far, the first {path}: {reason}). "
            f"Every read failing is the split's or the source's fault, not a few bad files': fix what the reason "
            f"says (loader.bad_samples lists them)")

    def say_epoch(self, epoch: int) -> None:
        """At an epoch's end: a warning where it met new files; later epochs skip them quietly."""
        if not self.in_epoch:
            return
        fill = "refilled with other samples of the split" if self._train else "left out"
        log.log(logging.WARNING if self._found_in_epoch else logging.DEBUG,
                "%s loader, split '%s', epoch %d, rank %d: files that cannot be decoded: %d (%d new this "
                "epoch), their batch slots %s; loader.bad_samples lists %d so far", self._backend,
                self._split, epoch, self._rank, len(self.in_epoch), self._found_in_epoch,
                fill, len(self.samples))

    def say_empty_batch(self, planned: int, epoch: int) -> None:
        """A planned batch none of whose files decodes: a warning the first time (its files are named
        as they are found), later ones at DEBUG level."""
        log.log(logging.DEBUG if self._empty_batches else logging.WARNING,
                "%s loader, split '%s', epoch %d, rank %d: a batch of %d samples comes out empty: none of its files "
                "can be decoded%s", self._backend, self._split, epoch, self._rank, planned,
                "" if self._empty_batches else " (later empty batches are logged at DEBUG level)")
        self._empty_batches += 1
