"""Which samples the DALI feed leaves out, and why: one record, which the loader owns.

Two lifetimes. A sample that broke the pipeline (the probe's finding after a failure, loader.py) is
left out for the run: feeding it again would break the next pipeline too. What a read or a check
found (a file cut short, a reset connection of a blob service) holds for its epoch only: the next
epoch reads the sample again, as the torch backend's workers do.
"""
from __future__ import annotations


class BadSamples:
    """sample -> why it cannot be fed: the run's refusals and this epoch's findings."""

    def __init__(self):
        self.refused: dict[int, str] = {}
        """Samples DALI could not decode (the probe): never fed again, in any epoch."""
        self.this_epoch: dict[int, str] = {}
        """Every sample left out this epoch: the refused, and what this epoch's reads found."""

    def new_epoch(self) -> None:
        """Forget what reads found: a new epoch (or a rebuilt pipeline's) reads those samples again."""
        self.this_epoch = dict(self.refused)

    def refuse(self, culprits: dict[int, str]) -> None:
        """These samples broke the pipeline: left out from the next epoch (`new_epoch`) on, for the run."""
        self.refused.update(culprits)

    def found(self, sample: int, why: str) -> None:
        """A read or check of this epoch found the sample unusable."""
        self.this_epoch[sample] = why

    def why(self, sample: int) -> str | None:
        return self.this_epoch.get(sample)

    def __contains__(self, sample: int) -> bool:
        return sample in self.this_epoch

    def __len__(self) -> int:
        return len(self.this_epoch)

    def none_of(self, samples: list[int]) -> bool:
        """Whether none of these samples is known bad this epoch (a batch that can be taken whole)."""
        return not self.this_epoch or self.this_epoch.keys().isdisjoint(samples)
