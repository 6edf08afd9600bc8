"""What a loader is, fixed when it is built: its config, split, index, ranks, device and the batch
plan it delivers, and the numbers read from them (len, batch_size, classes, describe).

The base of contract.Loader, which adds what changes as it runs (the epochs, the resume position,
the files skipped, the closed state); kept apart so that each reads in one sitting.
"""
from __future__ import annotations

import torch

from .config_dump import config_to_dict
from .device_ops import BatchFinisher
from .distributed import RankInfo
from .draws import Augmenter
from .order import EpochOrder
from .prepared import PreparedSplit
from .resolution import Resolution
from .schema import Config, SplitConfig
from .views import ViewFinisher, ViewPlan


class LoaderSetup:
    """The split as one loader delivers it: set once in __init__, never changed by a loop."""

    backend: str = "?"

    def __init__(self, config: Config, split: SplitConfig, prepared: PreparedSplit, ranks: RankInfo,
                 device: torch.device):
        self.config, self.split, self.index, self.ranks = config, split, prepared.index, ranks
        self.device = device
        self.pixels_from = prepared.pixels_from
        """Where the pixels come from: the image files, or a uint8 cache folder."""
        plan = prepared.batches  # what every batch is made of, planned with the index (prepared.plan_batches)
        self.resolution: Resolution | None = plan.resolution
        """The train split's size schedule (fastloader.resolution): a size per epoch or per batch (and a
        batch size per size, with batch_sizes)."""
        self.order: EpochOrder = plan.order
        self.augmentation: Augmenter | None = plan.augmentation
        """The train split's augmentation spec (fastloader.draws): what each sample's seed draws."""
        self.hooks = prepared.hooks
        """The user's own transforms (fastloader.hooks): the backends run them; the state names them."""
        self.views: ViewPlan | None = plan.views
        """A train split's view groups (fastloader.views): each sample's images are several views."""
        self.finisher: BatchFinisher | ViewFinisher | None = plan.finisher
        """The batch hook, random erasing, mixing and soft targets of each batch (fastloader.device_ops),
        or None: the backend applies it where it costs the training thread least."""

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
    def num_classes(self) -> int:
        """Classes in the split's label space: the width of soft targets."""
        return len(self.index.classes)

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return self.order.num_batches

    @property
    def dataset(self):
        """There is none: what Hugging Face Accelerate's skip_first_batches (and other code written
        for torch DataLoaders) reaches for. Said with the fix rather than as a bare AttributeError."""
        raise AttributeError(f"a fastloader loader (split '{self.split.name}') has no torch `dataset`: it reads its "
                             f"own index (loader.index) and shards it itself. To resume mid-epoch, restore its "
                             f"position rather than skipping batches: loader.load_state_dict(state), or with "
                             f"Accelerate accelerator.register_for_checkpointing(loader) before load_state "
                             f"(docs/accelerate.md)")

    def describe(self) -> dict:
        """What this loader is, for logs and reports."""
        return {"backend": self.backend, "split": self.split.name, "device": str(self.device),
                "batches": len(self), "batch_size": self.batch_size, "num_samples": self.num_samples,
                "rank": self.ranks.rank, "world_size": self.ranks.world_size, "pixels": self.pixels_from,
                "hooks": self.hooks.state(), "config": config_to_dict(self.config),
                **({"views": {g.name: [g.count, g.size] for g in self.views.groups}} if self.views else {})}

    @classmethod
    def depth_for(cls, config: Config, workers: int) -> int:
        """Batches a loader of this backend holds prepared ahead of its consumer with `workers`
        (PreparedSplit.workers): known before it is built, for what reading ahead costs (prepared.py)."""
        return 0
