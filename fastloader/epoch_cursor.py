"""Which epoch a loader's next `for` loop runs, where in that epoch's order it starts, and how far
the newest loop has got: what set_epoch, a loaded state and a `break` change, and what a saved
state records.
"""
from __future__ import annotations

import numbers

from .errors import StateError
from .schema import INT64_MAX


class EpochCursor:
    """The epoch and position of a loader's loops. Only the newest loop moves the position: an
    abandoned older one (left with `break`, still referenced) must not move where a resume starts."""

    def __init__(self):
        self.epoch = 0
        """The epoch of the latest loop started, or the one set for the next."""
        self._chosen = True  # the next loop runs `epoch` (the first loop runs epoch 0), not the one after it
        self.resume_position = 0
        """Where the next loop starts in its epoch's global order: a loaded state's position, else 0."""
        self.position = 0
        """Samples of the current epoch's global order consumed by all ranks together."""
        self.loops = 0
        """`for` loops started; the newest is the one that counts consumed batches."""

    @property
    def next_epoch(self) -> int:
        """The epoch the next loop runs: the one set (set_epoch, a loaded state), else the one after
        the last started."""
        return self.epoch if self._chosen else self.epoch + 1

    def choose(self, epoch: int) -> None:
        """set_epoch: the next loop runs this epoch from its start."""
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or not 0 <= epoch <= INT64_MAX:
            raise StateError(f"epoch must be an integer in [0, 2**63 - 1], got {epoch!r}")
        self.restore(int(epoch), 0)

    def restore(self, epoch: int, position: int) -> None:
        """A loaded state: the next loop runs this epoch from this position of its global order."""
        self.epoch, self._chosen = epoch, True
        self.resume_position = self.position = position

    def start_loop(self) -> tuple[int, int, int]:
        """A new `for` loop: (its epoch, where it starts, its number, which advance takes)."""
        if not self._chosen:
            self.epoch += 1
        self._chosen = False
        self.position, self.resume_position = self.resume_position, 0
        self.loops += 1
        return self.epoch, self.position, self.loops

    def advance(self, loop: int, samples: int) -> None:
        """Loop number `loop` consumed a step of `samples` (all ranks together); an older loop's is ignored."""
        if loop == self.loops:
            self.position += samples
