"""Reading ahead across epochs, one rule for both backends.

Both backends hand the batches after the current one to readers before the trainer asks for them
(the torch backend's DataLoader workers, the DALI feed's worker processes), and at an epoch's end
they read on into the next epoch's first batches, so that a new epoch does not begin with readers
that sit idle. Which batches those are (`epochs_after`), and how much of what is already in flight
a new loop keeps (`in_flight_prefix`: those batches that are its own first ones, sample for sample;
after a `break`, `set_epoch` or `load_state_dict` none are) is decided here. What is done with the
rest is each backend's: DALI's feed drops a read it no longer wants; a DataLoader iterator must
receive every batch it was given, in order.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

from .order import EpochOrder


def epochs_after(order: EpochOrder, epoch: int) -> Iterator[np.ndarray]:
    """The batches of every epoch after `epoch`, from their start: what the next loops most likely
    ask for. A function of the order alone: a reader that held the loader would keep a dropped
    loader alive until the garbage collector finds the cycle."""
    while True:
        epoch += 1
        yield from order.batches(epoch)


def in_flight_prefix(in_flight: Iterable[np.ndarray], wanted: Sequence[np.ndarray]) -> int:
    """How many of the batches in flight, in order, are the wanted loop's first ones, sample for sample."""
    matched = 0
    for sent, batch in zip(in_flight, wanted):
        if not np.array_equal(sent, batch):
            break
        matched += 1
    return matched
