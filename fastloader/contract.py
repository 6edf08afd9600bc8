"""The Loader contract both backends implement, and the behaviour they share.

Shared here, so that the backends cannot drift apart: which epoch a `for` loop runs, what `len`
means, the closed state, the (epoch, position) that a resume restarts from, the files skipped, the
batch finisher (random erasing, mixing, soft targets: one object each backend applies where it costs
the training thread least) and the start-up line that says what the loader is.
"""
from __future__ import annotations

import abc
import logging
import numbers
import time
from typing import Iterator

import numpy as np
import torch

from .config_dump import config_to_dict
from .device_ops import BatchFinisher
from .distributed import RankInfo
from .draws import Augmenter
from .errors import BadImageError, LoaderError, StateError
from .interfaces import Batch
from .machine import human_bytes
from .order import EpochOrder
from .prepared import PreparedSplit
from .resolution import Resolution
from .schema import INT64_MAX, MAX_BATCH, MAX_PROCESSES, MAX_RANKS, Config, SplitConfig
from .sources import reading
from .sources.protocol import forget_source
from .sources.stores import release_store
from .sources.user_source import check_unchanged
from .stats import LOG_LEVELS, LoaderStats
from .views import ViewFinisher, ViewPlan
from .weights import class_shares
from .words import plural

log = logging.getLogger("fastloader")

STATE_VERSION = 1
BACKEND_NAMES = ("dali", "torch")


class Loader(abc.ABC):
    """`for images, labels in loader`: images float [B, 3, H, W] normalized (with views, a list of
    one tensor per view group), labels int64 [B], or float32 soft targets [B, num_classes] where the
    split mixes or smooths labels (fastloader.interfaces.Batch says it all).

    Each `for` loop runs one epoch: the one given to `set_epoch`, else the one after the last
    started (0 first). Leaving a loop early with `break` is fine; the next loop starts afresh.
    """

    backend: str = "?"

    def __init__(self, config: Config, split: SplitConfig, prepared: PreparedSplit, ranks: RankInfo,
                 device: torch.device):
        index = prepared.index
        self.config, self.split, self.index, self.ranks = config, split, index, ranks
        self.device = device
        self.pixels_from = prepared.pixels_from
        """Where the pixels come from: the image files, or a uint8 cache folder."""
        plan = prepared.batches  # what every batch is made of, planned with the index (prepared.plan_batches)
        self.resolution: Resolution | None = plan.resolution
        """The train split's size schedule (fastloader.resolution): a size per epoch or per batch (and a
        batch size per size, with batch_sizes)."""
        self.order: EpochOrder = plan.order
        self._draw_words = self._describe_draws()
        self._epoch = 0
        self._epoch_set = True  # the first loop runs epoch 0
        self._resume_position = 0  # where the next loop starts in its epoch's global order
        self._position = 0  # samples of the current epoch's global order consumed by all ranks together
        self._loops = 0  # `for` loops started; only the newest one counts consumed batches
        self.stats = LoaderStats()
        """What the consumer of the latest `for` loop waited for (see fastloader.stats)."""
        self.bad_samples: list[tuple[str, str]] = []
        """(path, reason) of every file skipped so far under dataset.on_bad_image: skip: those the
        header check left out when the loader was built, then those that failed to decode."""
        self._bad_paths: set[str] = set()
        for path, reason in prepared.bad:  # left out of the index when it was prepared (logged then)
            self._list_bad(path, reason)
        self._skipped_in_epoch: set[str] = set()  # files that failed at decode time in the current epoch
        self._found_in_epoch = 0  # of them, those no earlier epoch had met
        self._empty_batches = 0  # batches yielded empty because none of their files decodes
        self.augmentation: Augmenter | None = plan.augmentation
        """The train split's augmentation spec (fastloader.draws): what each sample's seed draws."""
        policy = self.augmentation.policy if self.augmentation else None
        if policy and not policy.keeps_color_jitter and split.transform.color_jitter is not None:
            log.info("%s: %s.transform.color_jitter is off because %s.transform.auto_augment is set, as in timm",
                     config.source, split.name, split.name)
        self.hooks = prepared.hooks
        self._workers = prepared.workers  # the backend's parallelism, for prefetch_depth
        """The user's own transforms (fastloader.hooks): the backends run them; the state names them."""
        self.views: ViewPlan | None = plan.views
        """A train split's view groups (fastloader.views): each sample's images are several views."""
        self.finisher: BatchFinisher | ViewFinisher | None = plan.finisher
        """The batch hook, random erasing, mixing and soft targets of each batch (fastloader.device_ops),
        or None: the backend applies it where it costs the training thread least."""
        self._closed = False
        self._reads_shards = prepared.pixels is None and index.ranges is not None
        self._plan = None  # the shards the running loop reads, fetched ahead (shards in an object store)
        if self.order.num_batches == 0:
            key = f"{split.name}.batch_size{'s (their smallest)' if split.batch_sizes else ''}"
            log.warning("%s: split '%s' yields no batch per epoch on rank %d: %d samples, batch_size %d x "
                        "world_size %d with drop_last: true; lower %s or set %s.drop_last: false",
                        config.source, split.name, ranks.rank, len(index),
                        min(split.batch_sizes or [split.batch_size]), ranks.world_size, key, split.name)
        if self.order.padded:
            log.info("split '%s': %s repeated per epoch so that %d ranks yield equal batches",
                     split.name, plural(self.order.padded, "sample"), ranks.world_size)
        if split.epoch_size is not None and prepared.draws is None:
            log.info("split '%s': %s.epoch_size %d: %s, %.3g passes over its %s, each in a new order",
                     split.name, split.name, split.epoch_size, self._draw_words, split.epoch_size / max(1, len(index)),
                     plural(len(index), "sample"))

    def _describe_draws(self) -> str:
        """What an epoch draws, for the epoch's line: weighted draws and the class shares they give, or
        passes of an epoch_size; empty for a plain permutation."""
        draws = self.order.draws
        if draws is not None:
            return (f"{plural(draws.size, 'weighted draw')} an epoch ({draws.origin}; expected class shares: "
                    f"{class_shares(self.index, draws.probabilities)})")
        if self.split.epoch_size is not None:
            return f"{self.order.length} positions an epoch"
        return ""

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
    def num_classes(self) -> int:
        """Classes in the split's label space: the width of soft targets."""
        return len(self.index.classes)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def size(self) -> int:
        """The output side of the current epoch's images (progressive resolution: this epoch's size);
        with a size per batch (transform.sizes), the largest a batch may have: each batch's is its
        images' last dimension."""
        return self.resolution.epoch_size(self._epoch) if self.resolution else self.split.transform.size

    @property
    def dataset(self):
        """There is none: what Hugging Face Accelerate's skip_first_batches (and other code written
        for torch DataLoaders) reaches for. Said with the fix rather than as a bare AttributeError."""
        raise AttributeError(f"a fastloader loader (split '{self.split.name}') has no torch `dataset`: it reads its "
                             f"own index (loader.index) and shards it itself. To resume mid-epoch, restore its "
                             f"position rather than skipping batches: loader.load_state_dict(state), or with "
                             f"Accelerate accelerator.register_for_checkpointing(loader) before load_state "
                             f"(docs/accelerate.md)")

    @property
    def next_epoch(self) -> int:
        """The epoch the next `for` loop runs: the one set (set_epoch, a loaded state), else the one
        after the last started."""
        return self._epoch if self._epoch_set else self._epoch + 1

    @property
    def resume_position(self) -> int:
        """Where the next loop starts in its epoch's global order: a loaded state's position, else 0."""
        return self._resume_position

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return self.order.num_batches

    def set_epoch(self, epoch: int) -> None:
        """Make the next `for` loop run this epoch (its order is a function of seed and epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or not 0 <= epoch <= INT64_MAX:
            raise StateError(f"epoch must be an integer in [0, 2**63 - 1], got {epoch!r}")
        self._epoch, self._epoch_set = int(epoch), True
        self._resume_position = self._position = 0

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise self._closed_error()
        check_unchanged(self.index)  # a user's source that grew, shrank or changed since it was indexed
        if not self._epoch_set:
            self._epoch += 1
        self._epoch_set = False
        self._position, self._resume_position = self._resume_position, 0
        self._loops += 1
        return self._run_epoch(self._epoch, self._position, self._loops)

    def _run_epoch(self, epoch: int, start: int, loop: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        global_batch = self.batch_size * self.ranks.world_size  # ranks step together (DDP)
        paired = self.order.paired  # a batch size per size: each step takes its own batch size on every rank
        stats = self.stats = LoaderStats(epoch=epoch)
        self._skipped_in_epoch, self._found_in_epoch = set(), 0  # a loop left with `break` does not carry them over
        clock = time.perf_counter
        began = clock()  # the consumer asked for the first batch: generators start on the first next()
        planned = self.order.batches(epoch, start)
        plan, fetched = self._will_read(planned, epoch)
        read = np.cumsum([len(batch) for batch in planned]).tolist() if plan is not None else []
        batches = iter(self._iter_batches(planned))
        try:
            while True:
                asked = clock()
                try:
                    images, labels = next(batches)
                except StopIteration:
                    break
                arrived = clock()
                stats.add(arrived - asked if stats.batches else arrived - began, arrived - began, len(labels))
                if not stats.images and self.split.mode == "train" and self._skipped_in_epoch:
                    raise self._nothing_read(epoch)  # a train slot that stays empty: all its substitutes failed too
                if plan is not None:  # the shards read up to here may go; what was fetched and waited for
                    plan.reached(read[stats.batches - 1])
                    self._count_fetches(stats, fetched)
                if loop == self._loops:  # an abandoned older loop no longer moves the resume position
                    step = len(planned[stats.batches - 1]) * self.ranks.world_size if paired else global_batch
                    self._position += step
                yield images, labels
        finally:
            if plan is not None:
                plan.cancel()
        if stats.batches and not stats.images and self._skipped_in_epoch:
            raise self._nothing_read(epoch)
        self._log_stats(stats)
        if self._skipped_in_epoch:  # a warning where this epoch met new files; later epochs skip them quietly
            fill = "refilled with other samples of the split" if self.split.mode == "train" else "left out"
            log.log(logging.WARNING if self._found_in_epoch else logging.DEBUG,
                    "%s loader, split '%s', epoch %d, rank %d: files that cannot be decoded: %d (%d new this "
                    "epoch), their batch slots %s; loader.bad_samples lists %d so far", self.backend,
                    self.split.name, epoch, self.ranks.rank, len(self._skipped_in_epoch), self._found_in_epoch,
                    fill, len(self.bad_samples))

    def _will_read(self, planned: list[np.ndarray], epoch: int):
        """Tell the byte seam which shards this loop reads, in order (those in an object store are
        fetched ahead); (the plan, the fetch counters before it), or (None, None)."""
        if self._plan is not None:
            self._plan.cancel()
        self._plan = None
        ranges = self.index.ranges
        if not self._reads_shards or not planned or not reading.is_remote(ranges.files[0]):
            return None, None
        before = reading.fetch_counters(self.index.store)
        sequence = ranges.file[np.concatenate([batch[:, 0] for batch in planned])]
        self._plan = reading.will_read(ranges.files, ranges.identities, sequence,
                                       f"split '{self.split.name}', epoch {epoch}, rank {self.ranks.rank}",
                                       self.index.store)
        return self._plan, before

    def _count_fetches(self, stats: LoaderStats, before) -> None:
        done = reading.fetch_counters(self.index.store).since(before)
        stats.network_wait_s, stats.fetched_bytes, stats.fetched_shards = (done.wait_s, done.fetched_bytes,
                                                                          done.fetched_shards)

    def _skip_sample(self, path: str, reason: str) -> None:
        """A file that failed at decode time (its slot refilled in train mode, left out in eval):
        listed and logged once, counted once per epoch."""
        self._skipped_in_epoch.add(path)
        if self._list_bad(path, reason):
            self._found_in_epoch += 1
            log.warning("skipped %s: %s (dataset.on_bad_image: skip; listed in loader.bad_samples)", path, reason)

    def _nothing_read(self, epoch: int) -> BadImageError:
        """An epoch that read no sample: an error, not batches of nothing to train on. Said where it is
        clear, the first train batch that stays empty (every slot's file and substitutes failed) or an
        eval epoch's end, with what failed first."""
        failed = [(path, reason) for path, reason in self.bad_samples if path in self._skipped_in_epoch]
        path, reason = failed[0] if failed else ("?", "?")
        return BadImageError(
            f"{self.backend} loader, split '{self.split.name}', epoch {epoch}, rank {self.ranks.rank}: no sample could "
            f"be read ({plural(len(self._skipped_in_epoch), 'sample')} failed so far, the first {path}: {reason}). "
            f"Every read failing is the split's or the source's fault, not a few bad files': fix what the reason "
            f"says (loader.bad_samples lists them)")

    def _empty_batch(self, planned: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What a planned batch none of whose files decodes yields (eval; train where no substitute
        decodes either): no images, logged (a warning the first time; its files are named as they
        are found). Never left out, so that every rank yields len(loader) batches (DDP steps
        together) and the resume position counts planned batches."""
        log.log(logging.DEBUG if self._empty_batches else logging.WARNING,
                "%s loader, split '%s', epoch %d, rank %d: a batch of %d samples comes out empty: none of its files "
                "can be decoded%s", self.backend, self.split.name, self.epoch, self.ranks.rank, planned,
                "" if self._empty_batches else " (later empty batches are logged at DEBUG level)")
        self._empty_batches += 1
        dtype = getattr(torch, self.config.output.dtype)
        if self.views is not None:
            return (self.views.empty(dtype, self.device, self.config.output.channels_last),
                    torch.empty(0, dtype=torch.int64, device=self.device))
        size = self.size
        memory_format = torch.channels_last if self.config.output.channels_last else torch.contiguous_format
        images = torch.empty((0, 3, size, size), dtype=dtype, device=self.device,
                             memory_format=memory_format)
        if self.finisher is not None and self.finisher.mixer is not None:
            return images, torch.empty((0, self.num_classes), dtype=torch.float32, device=self.device)
        return images, torch.empty(0, dtype=torch.int64, device=self.device)

    def _list_bad(self, path: str, reason: str) -> bool:
        """Add the file to bad_samples unless it is there already; whether it was new."""
        if path in self._bad_paths:
            return False
        self._bad_paths.add(path)
        self.bad_samples.append((path, reason))
        return True

    def _log_stats(self, stats: LoaderStats) -> None:
        level = LOG_LEVELS.get(self.config.stats.log_level)
        if level is not None and stats.batches:
            log.log(level, "%s loader, split '%s', epoch %d, rank %d: %s%s", self.backend, self.split.name,
                    stats.epoch, self.ranks.rank, stats.summary(), self._recipe_words(stats.epoch))

    def _recipe_words(self, epoch: int | None = None) -> str:
        """'; size ...; mixing ..., repeated augmentation ...' when they are on, for the epoch's line."""
        mixer = self.finisher.mixer if self.finisher is not None else None
        words = [self.resolution.describe(epoch)] if self.resolution and not self.resolution.fixed else []
        words += [mixer.describe()] if mixer is not None else []
        if self._draw_words:
            words.append(self._draw_words)
        if self.order.repeats > 1:
            words.append(f"repeated augmentation x{self.order.repeats} ({self.order.epoch_length} positions "
                         f"per epoch over {plural(self.ranks.world_size, 'rank')})")
        return "".join(f"; {w}" for w in words)

    def state_dict(self) -> dict:
        """Where the trainer is: resuming from it yields exactly the batches not yet consumed.

        Plain ints and strings (JSON or torch.save). Ranks of a data-parallel job step together, so
        every rank's state is the same and rank 0's is enough to resume all of them.
        """
        return {"version": STATE_VERSION, "backend": self.backend, "split": self.split.name,
                "dataset": self.index.fingerprint, "num_samples": len(self.index), "seed": self.config.seed,
                "shuffle": self.split.shuffle, "block_size": self.order.blocks.budget if self.order.blocks else 0,
                "weights": self.order.draws.digest if self.order.draws else "",
                "weights_from": self.order.draws.origin if self.order.draws else "",
                "epoch_size": self.order.length, "aug_repeats": self.order.repeats,
                "sizes": self.resolution.key() if self.resolution else f"size {self.split.transform.size}",
                "epoch": self._epoch,
                "position": min(self._position, self.order.epoch_length),
                "batch_size": self.batch_size, "world_size": self.ranks.world_size, "hooks": self.hooks.state()}

    def load_state_dict(self, state: dict, force_hooks: bool = False) -> None:
        """Make the next `for` loop continue the saved epoch after its last consumed batch.

        Another world size or batch size re-shards the rest of the epoch: the ranks together still
        get every remaining sample once (eval) or equal shares of it (train). A state saved with
        other hooks (their names or versions) is refused: their draws would not replay; force_hooks
        resumes anyway (the samples and the loader's own draws are the same).
        """
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise StateError(f"loader state version {found!r} is not {STATE_VERSION}: pass the dict that "
                             f"loader.state_dict() returned, saved by this fastloader version")
        self._refuse_other(state)
        self._refuse_out_of_range(state)
        self._refuse_other_hooks(state, force_hooks)
        if state["backend"] != self.backend:
            log.info("split '%s': resuming a state the %s backend saved on the %s backend: the same samples, crops, "
                     "flips and ops (drawn from each sample's seed), with pixels within the backends' tolerance "
                     "(docs/semantics.md)", self.split.name, state["backend"], self.backend)
        epoch, position = int(state["epoch"]), int(state["position"])
        resharded = (state["world_size"], state["batch_size"]) != (self.ranks.world_size, self.batch_size)
        if resharded:
            self._warn_left_out(state, epoch, position)
        if self.order.shared_after(position, epoch) == 0:  # saved at the end of an epoch: go on with the next
            epoch, position = epoch + 1, 0
        elif resharded:
            log.info("split '%s': resuming epoch %d at sample %d of %d with %s x batch %d; the state was "
                     "saved by %s x batch %d, so the rest of the epoch is re-sharded", self.split.name, epoch,
                     position, self.order.epoch_length, plural(self.ranks.world_size, "rank"), self.batch_size,
                     plural(state["world_size"], "rank"), state["batch_size"])
        self._epoch, self._epoch_set = epoch, True
        self._resume_position = self._position = position

    def _warn_left_out(self, state: dict, epoch: int, position: int) -> None:
        """A resume on other ranks or another batch size that leaves out samples the saved run would
        have read (drop_last takes whole steps only, and the rest of the epoch no longer makes them):
        said, naming the keys, since no whole step can read them."""
        then = self.order.shared_after(position, epoch, state["world_size"], state["batch_size"])
        now = self.order.shared_after(position, epoch)
        if now >= then:
            return
        name, left = self.split.name, self.order.epoch_length - position
        log.warning("split '%s': resuming epoch %d at sample %d of %d with %s x batch %d leaves out %s that the "
                    "state's %s x batch %d would read: %s.drop_last: true takes whole steps only (a batch on every "
                    "rank), and the %d samples left do not fill them. To read them, finish the epoch with "
                    "%s.batch_size: %d on %s, or set %s.drop_last: false (a last, smaller batch)", name, epoch,
                    position, self.order.epoch_length, plural(self.ranks.world_size, "rank"), self.batch_size,
                    plural(then - now, "sample"), plural(state["world_size"], "rank"), state["batch_size"], name,
                    left, name, state["batch_size"], plural(state["world_size"], "rank"), name)

    def _refuse_other(self, state: dict) -> None:
        """A state of another split, dataset, seed or order cannot replay this run's batches. Another
        backend's can: both draw every random choice from the samples' seeds."""
        mine = self.state_dict()
        name = self.split.name
        if state.get("backend") not in BACKEND_NAMES:
            raise StateError(f"loader state names backend {state.get('backend')!r}, not one of "
                             f"{', '.join(BACKEND_NAMES)}: pass the dict that loader.state_dict() returned")
        if state.get("split") != name:
            raise StateError(f"loader state was saved for split {state.get('split')!r}, this loader reads split "
                             f"{name!r}; give each split's loader its own state")
        if state.get("dataset") != mine["dataset"]:
            raise StateError(f"loader state was saved for another dataset: {state.get('num_samples')} samples "
                             f"(fingerprint {state.get('dataset')}) then, {mine['num_samples']} samples "
                             f"(fingerprint {mine['dataset']}) in {self.index.root} now; files were added, removed "
                             f"or relabelled. Resume on the same files, or start afresh without load_state_dict")
        # states saved before repeats, blocks or weights: no repeats, no blocks, no weights, the split's size
        saved_order = {**state, "aug_repeats": state.get("aug_repeats", 1), "block_size": state.get("block_size", 0),
                       "weights": state.get("weights", ""), "epoch_size": state.get("epoch_size",
                                                                                     state.get("num_samples"))}
        if saved_order["weights"] != mine["weights"]:
            then = f"weights from {state.get('weights_from')}" if saved_order["weights"] else "no weights"
            now = f"weights from {mine['weights_from']}" if mine["weights"] else "no weights"
            keys = mine["weights_from"] or state.get("weights_from") or f"{name}.weights"
            raise StateError(f"loader state was saved with {then} (digest {saved_order['weights'] or '-'}), this "
                             f"loader draws with {now} (digest {mine['weights'] or '-'}, from {self.config.source}); "
                             f"set {keys} back as they were, on the same samples, to resume the same order")
        saved_order["sizes"] = state.get("sizes", mine["sizes"])  # states before size schedules: not checked
        if str(saved_order["sizes"]).startswith("size ") and mine["sizes"].startswith("size "):
            saved_order["sizes"] = mine["sizes"]  # a fixed size may change on resume: the samples are the same
        order_keys = (("seed", "seed"), ("shuffle", f"{name}.shuffle"), ("aug_repeats", f"{name}.aug_repeats"),
                      ("block_size", f"{name}.block_size"), ("epoch_size", f"{name}.epoch_size"),
                      ("sizes", f"{name}.transform's size schedule (size, progressive, sizes; {name}.batch_sizes)"))
        for key, config_key in order_keys:
            if saved_order.get(key) == mine[key]:
                continue
            saved = saved_order.get(key)
            if key == "block_size" and isinstance(saved, int) and not isinstance(saved, bool) and saved > 0:  # bytes
                raise StateError(f"loader state was saved with {config_key}: {saved} bytes ({human_bytes(saved)}), "
                                 f"this loader's blocks hold {mine[key]} bytes ({human_bytes(mine[key])}); set "
                                 f"{config_key}: {saved}B to resume the same order")
            raise StateError(f"loader state was saved with {config_key}: {saved!r}, this loader has "
                             f"{config_key}: {mine[key]!r} (from {self.config.source}); set it back to "
                             f"resume the same order")

    def _refuse_other_hooks(self, state: dict, force: bool) -> None:
        """The hooks a state was saved with against this loader's (a state from before hooks: none)."""
        saved, mine = state.get("hooks", {}), self.hooks.state()
        if not isinstance(saved, dict) or not all(isinstance(v, str) for v in saved.values()):
            raise StateError(f"loader state: hooks must be a mapping of hook kinds to names, got {saved!r}; pass the "
                             f"dict that loader.state_dict() returned")
        if saved == mine:
            return
        differ = "; ".join(f"{kind}: {saved.get(kind, 'none')} then, {mine.get(kind, 'none')} now"
                           for kind in sorted(set(saved) | set(mine)) if saved.get(kind) != mine.get(kind))
        if force:
            log.warning("split '%s': resuming with other hooks than the state's (%s), as force_hooks asks: the "
                        "samples and fastloader's own draws replay, the hooks' do not", self.split.name, differ)
            return
        raise StateError(f"loader state was saved with other hooks ({differ}): their draws would not replay. Give "
                         f"the same hooks (a hook's `version` attribute names a change), or pass force_hooks=True to "
                         f"load_state_dict to resume anyway")

    def _refuse_out_of_range(self, state: dict) -> None:
        """Every number of the state, checked against this loader: a position of -8 would deliver 8
        samples twice, an epoch past int64 fails deep in numpy. A ValueError names the field and its range."""
        epoch_length = self.order.epoch_length
        ranges = {"epoch": (0, INT64_MAX, "epochs count from 0"),
                  "position": (0, epoch_length, f"samples of the epoch's order consumed by all ranks; split "
                                                f"'{self.split.name}' has {epoch_length} per epoch"),
                  "batch_size": (1, MAX_BATCH, "samples per batch on each rank"),
                  "world_size": (1, MAX_RANKS, "ranks"),
                  "num_samples": (0, INT64_MAX, "samples in the split"),
                  "seed": (0, INT64_MAX, "the config's seed"),
                  "aug_repeats": (1, MAX_PROCESSES, f"{self.split.name}.aug_repeats"),
                  "block_size": (0, INT64_MAX, f"bytes of {self.split.name}.block_size; 0: no blocks"),
                  "epoch_size": (1, INT64_MAX, f"positions of an epoch's order ({self.split.name}.epoch_size)")}
        for key in ("weights", "weights_from"):
            if not isinstance(state.get(key, ""), str):
                raise StateError(f"loader state: {key} must be a string (the sample weights' digest and keys), got "
                                 f"{state.get(key)!r}; pass the dict that loader.state_dict() returned")
        if not isinstance(state.get("shuffle"), bool) and state.get("shuffle") != "block":
            raise StateError(f"loader state: shuffle must be true, false or 'block' ({self.split.name}.shuffle), got "
                             f"{state.get('shuffle')!r}; pass the dict that loader.state_dict() returned")
        for key, (low, high, meaning) in ranges.items():
            value = state.get(key, {"aug_repeats": 1, "block_size": 0,  # states before repeats, blocks, weights
                                    "epoch_size": state.get("num_samples")}.get(key))
            if value is None or isinstance(value, bool) or not isinstance(value, numbers.Integral):
                found = "no such field" if value is None else f"{type(value).__name__} {value!r}"
                raise StateError(f"loader state: {key} must be an integer in [{low}, {high}] ({meaning}), got "
                                 f"{found}; pass the dict that loader.state_dict() returned")
            if not low <= value <= high:
                raise StateError(f"loader state: {key} {value} is not in [{low}, {high}] ({meaning}); pass the "
                                 f"dict that loader.state_dict() returned")

    def close(self) -> None:
        """Stop workers / free the pipeline. Iterating afterwards raises an error."""
        if not self._closed:
            self._closed = True
            if self._plan is not None:
                self._plan.cancel()
            self._close()
            forget_source(self.index.reader)
            release_store(self.index.store)

    def _superseded(self) -> LoaderError:
        """What a paused loop says when it is resumed after a newer loop took the loader over (two
        loops never take batches in turn: each would get the other's); the loader's close ended it."""
        if self._closed:
            return self._closed_error()
        return LoaderError(f"a newer loop over the {self.backend} loader for split '{self.split.name}' started while "
                           f"this one was paused; finish or drop a loop before starting the next")

    def _closed_error(self) -> LoaderError:
        return LoaderError(f"this {self.backend} loader for split '{self.split.name}' is closed; "
                           f"build a new one with fastloader.build_loader(...)")

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        """A dropped loader lets go of its workers without waiting for anything: the cycle collector
        runs finalizers on whichever thread allocates (maybe a backend's own thread), a forked child
        inherits loaders whose threads stayed in the parent, and the interpreter may be shutting down."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._drop()
            forget_source(self.index.reader)
            release_store(self.index.store)
        except Exception:
            pass

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

    @property
    def prefetch_depth(self) -> int:
        """Batches the loader may hold prepared ahead of its consumer (a benchmark drains them):
        depth_for its workers."""
        return self.depth_for(self.config, self._workers)

    def _parallelism(self) -> str:
        """How it decodes in parallel, as `repr` shows it (workers, or DALI's flavour and threads)."""
        return ""

    def _announce(self) -> None:
        """Once the backend has built itself: log the repr, the one line that says what this loader
        is and where its pixels come from (both backends, the same words)."""
        ops = f"; augmentation: {self.augmentation.describe()}" if self.augmentation and self.augmentation.slots else ""
        hooks = "".join(f"; {hook.label}" for hook in self.hooks.all())
        if self.views is not None:  # each group on a line of its own: one line of them all ran to 1,200 characters
            ops = ""
        log.info("%r; ranks: %s%s%s", self, self.ranks.source, ops, hooks)
        for g in self.views.groups if self.views is not None else ():
            log.info("split '%s': views %s: %d x %d px, scale %s, augmentation: %s", self.split.name, g.name, g.count,
                     g.size, list(g.split.transform.scale), g.augmenter.describe())

    def __repr__(self) -> str:
        """What the loader is doing, so that `print(loader)` answers "which backend, where, how wide"."""
        closed = ", closed" if self._closed else ""
        sizes = self.resolution and self.resolution.per_batch
        size = f"sizes={self.split.transform.sizes!r}" if sizes else f"size={self.size}"
        if self.split.batch_sizes:
            size += f", batch_sizes={self.split.batch_sizes!r}"
        size = f"views=[{self.views.describe()}]" if self.views else size
        return (f"{type(self).__name__}(split={self.split.name!r}, backend={self.backend!r}, {self._parallelism()}, "
                f"device={str(self.device)!r}, {size}, samples={self.num_samples}, batches={len(self)} of "
                f"{self.batch_size}, rank={self.ranks.rank}/{self.ranks.world_size}, pixels from "
                f"{self.pixels_from}{self._ops_repr()}{closed})")

    def _ops_repr(self) -> str:
        """The policy (or colour jitter) a train split applies, for repr."""
        t = self.split.transform
        if not self.augmentation or not self.augmentation.slots or self.views:
            return ""
        return f", auto_augment={t.auto_augment!r}" if t.auto_augment else f", color_jitter={t.color_jitter!r}"

    # -- what a backend provides -----------------------------------------------------------------

    @abc.abstractmethod
    def _iter_batches(self, batches: list) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (images, labels) on self.device for these batches of (sample index, sample seed),
        finished by self.finisher (erasing, mixing, soft targets) where it is not None, from the seeds
        of the samples delivered: one item per planned batch, whatever fails to decode (a train
        slot refilled from `order.substitutes`, an eval batch shorter, or `_empty_batch`)."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release workers, pipelines and memory."""

    def _drop(self) -> None:
        """What `_close` releases, for `__del__`: without waiting on any thread or process. A backend
        whose `_close` never waits keeps this default."""
        self._close()
