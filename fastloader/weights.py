"""What a train split draws by: each sample's weight, from `<split>.weights` (a file of `name weight`
lines), `<split>.class_weights` (inverse, sqrt or a mapping) and the sources' weights; the epoch's
size; and the class shares they give, for the log and `fastloader check`.

The draws themselves are order.py's WeightedDraws; this module turns config keys into its weights,
and refuses what cannot be drawn from, naming the key and the fix: a weight that is negative, NaN or
infinite, weights that are all 0, a name the split lacks, a class it lacks, an epoch smaller than
one batch on every rank.
"""
from __future__ import annotations

import difflib
import logging
import math
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .distributed import RankInfo
from .errors import ConfigError
from .locations import not_regular, open_regular
from .machine import available_memory, human_bytes
from .order import WeightedDraws
from .samples import SampleIndex
from .schema import Config, SplitConfig, draws_from
from .sources.exclude import read_exclude_list
from .sources.folder import dataset_root
from .sources.formats import held_out_of
from .words import plural

log = logging.getLogger("fastloader")

MANY_CLASSES = 10
"""Above this, class shares are summarized: the most and the least drawn classes."""
SHOWN = 3
"""Classes named at each end of a summary."""


@dataclass(frozen=True)
class WeightsFile:
    """A `<split>.weights` file, read: each name (as dataset.exclude reads them: relative to
    dataset.root) with its weight and line."""
    path: str
    weights: dict[str, tuple[float, int]]
    """name -> (weight, line number)."""


class WeightPlan:
    """What a split draws by, read from the config once, before its index is built: an epoch_size too
    small for the ranks, or a bad weights file, fails then. `draws` applies it to the prepared index."""

    def __init__(self, config: Config, split: SplitConfig, ranks: RankInfo):
        self.config, self.split = config, split
        check_epoch_size(config, split, ranks)
        self.table = read_weights_file(config, split)
        """The split's weights file, read and checked; None without one."""

    def draws(self, index: SampleIndex, left_out: Iterable[str] = ()) -> WeightedDraws | None:
        """The weighted draws over the prepared index (weighted_draws); `left_out`: the paths of the
        files the split left out as bad, which the weights file may name."""
        return weighted_draws(self.config, self.split, index, self.table, left_out)


def check_epoch_size(config: Config, split: SplitConfig, ranks: RankInfo) -> None:
    """An epoch_size below world_size x batch_size leaves a rank without a whole batch: refused at once."""
    size, key = split.epoch_size, f"{split.name}.epoch_size"
    least = ranks.world_size * split.batch_size
    if size is not None and size < least:
        raise ConfigError(f"{config.origin(key)}: {key}: {size} is below world_size x batch_size ({ranks.world_size} "
                          f"x {split.batch_size} = {least}), so a rank would not get one whole batch an epoch; set "
                          f"{key} to at least {least}, or lower {split.name}.batch_size")
    if size is not None:
        available = available_memory()
        if size * ORDER_BYTES_PER_POSITION > available // 2:
            fits = available // 2 // ORDER_BYTES_PER_POSITION
            raise ConfigError(f"{config.origin(key)}: {key}: {size:,} positions make an epoch's order of "
                              f"{human_bytes(size * ORDER_BYTES_PER_POSITION)} while it is drawn, more than half the "
                              f"memory this machine has free ({human_bytes(available)}); set {key} to at most "
                              f"{fits:,}, or run more, shorter epochs")


ORDER_BYTES_PER_POSITION = 16
"""An epoch's order is made whole: 8 bytes a position, 16 while it is drawn (order.py)."""


def read_weights_file(config: Config, split: SplitConfig) -> WeightsFile | None:
    """`<split>.weights`, read and checked line by line (before the split is indexed, so a bad file
    fails at once): every weight finite and >= 0, every name once."""
    path = split.weights
    if path is None:
        return None
    key = f"{split.name}.weights"
    where = f"{config.origin(key)}: {key}"
    if not os.path.isfile(path):
        what = not_regular(os.stat(path).st_mode) if os.path.exists(path) else "does not exist"
        raise ConfigError(f"{where}: {path!r} {what}; give the path of a text file of `name weight` lines (names "
                          f"as `fastloader check` writes them, relative to dataset.root)")
    root = dataset_root(config)
    weights: dict[str, tuple[float, int]] = {}
    normpath, relpath = os.path.normpath, os.path.relpath  # (a million lines: each name normalized where it must)
    with open(open_regular(path), encoding="utf-8", errors="surrogateescape") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(None, 1)
            weight = _number(parts[1]) if len(parts) == 2 else None
            if weight is None:
                raise ConfigError(f"{where}: {path}:{number}: expected `name weight` (a sample's name, then a "
                                  f"number), got {line[:80]!r}")
            if not math.isfinite(weight) or weight < 0:
                raise ConfigError(f"{where}: {path}:{number}: the weight of {parts[0]!r} is {parts[1]}; a weight is a "
                                  f"finite number >= 0 (0 leaves the sample out of the draws): fix that line")
            name = parts[0]
            if name[:1] in (os.sep, ".") or "/." in name or "//" in name or name[-1:] == os.sep:  # else it is normal
                name = normpath(relpath(name, root) if name[:1] == os.sep else name)
            if name in weights:
                raise ConfigError(f"{where}: {path}:{number}: {parts[0]!r} is named again (first on line "
                                  f"{weights[name][1]}); give each sample one line")
            weights[name] = (weight, number)
    if not weights:
        raise ConfigError(f"{where}: {path!r} holds no `name weight` line; write one per sample, or remove {key}")
    return WeightsFile(path, weights)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def weighted_draws(config: Config, split: SplitConfig, index: SampleIndex, table: WeightsFile | None = None,
                   left_out: Iterable[str] = ()) -> WeightedDraws | None:
    """The split's weighted draws over its (prepared) index, logged with the class shares they give;
    None where nothing weighs its samples. `table`: its weights file, read; `left_out`: the paths of
    the files the split left out (bad files), which the weights file may name."""
    keys = draws_from(split)
    if not keys:
        return None
    weights = sample_weights(config, split, index, table, left_out)
    size = split.epoch_size or len(index)
    draws = WeightedDraws(weights, size, origin=draws_origin(split))
    log.info("split '%s': %s an epoch, drawn with replacement in proportion to %s; expected class shares: %s",
             split.name, plural(size, "draw"), draws.origin, class_shares(index, draws.probabilities))
    return draws


def draws_origin(split: SplitConfig) -> str:
    """The keys that weigh the split's samples as the log, `check` and a refused state show them:
    `train.weights: w.txt, train.class_weights: inverse`."""
    shown = []
    for key in draws_from(split):
        if key.endswith(".class_weights") and isinstance(split.class_weights, str):
            key = f"{key}: {split.class_weights}"
        elif key.endswith(".weights"):
            key = f"{key}: {split.weights}"
        shown.append(key)
    return ", ".join(shown)


def sample_weights(config: Config, split: SplitConfig, index: SampleIndex, table: WeightsFile | None = None,
                   left_out: Iterable[str] = ()) -> np.ndarray:
    """float64 [len(index)]: each sample's weight, the product of its line in the weights file and its
    class's weight; with weighted sources, scaled so that each source's samples share its weight."""
    weights = np.ones(len(index), dtype=np.float64)
    weighted_sources = split.sources is not None and all(source.weight is not None for source in split.sources)
    if split.weights is not None:
        weights *= _relative(_file_weights(config, split, index, table or read_weights_file(config, split), left_out))
    if split.class_weights is not None:
        weights *= _relative(_class_weights(config, split, index, by_source=weighted_sources))
    if not weights.any():
        keys = " and ".join(key for key in draws_from(split) if not key.endswith("].weight"))
        raise ConfigError(f"{config.origin(keys.split(' ')[0])}: {keys}: every sample of split '{split.name}' weighs "
                          f"0, so none can be drawn; give some samples a weight above 0")
    if weighted_sources:
        weights = _source_shares(config, split, index, weights)
    return weights


def _file_weights(config: Config, split: SplitConfig, index: SampleIndex, table: WeightsFile,
                  left_out: Iterable[str]) -> np.ndarray:
    """Each sample's weight from the file, by name; a name the split lacks, or a sample without a line,
    refused (a name of a file the split left out, as bad or by dataset.exclude, or held out into
    another split, is fine)."""
    key = f"{split.name}.weights"
    root = dataset_root(config)
    lines = dict(table.weights)
    weights = np.empty(len(index), dtype=np.float64)
    missing, first_missing = 0, None
    for sample, name in enumerate(sample_names(index, root)):
        found = lines.pop(name, None)
        if found is None:
            missing += 1
            first_missing = first_missing or name
            continue
        weights[sample] = found[0]
    if missing:
        raise ConfigError(f"{config.origin(key)}: {key}: {table.path} gives no weight to {missing} of the "
                          f"{len(index)} samples of split '{split.name}' (the first: {first_missing!r}); give every "
                          f"sample a line `name weight` (0 leaves it out of the draws)")
    if lines:
        known = {os.path.normpath(os.path.relpath(path, root)) for path in left_out}
        if config.dataset.exclude:
            known |= read_exclude_list(config.dataset.exclude, root)
        unknown = sorted(((line, name) for name, (_, line) in lines.items() if name not in known))
        if unknown:  # a file for the whole folder names the samples held out into another split too
            taken = held_out_of(config, split)
            held = set(sample_names(taken, root)) if taken is not None else set()
            unknown = [(line, name) for line, name in unknown if name not in held]
        if unknown:
            line, name = unknown[0]
            raise ConfigError(f"{config.origin(key)}: {key}: {table.path}:{line} names {name!r}, which split "
                              f"'{split.name}' lacks ({plural(len(unknown), 'name')} such); names are as `fastloader "
                              f"check` writes them, relative to dataset.root ({root}). Remove those lines, or fix "
                              f"the names")
    return weights


def sample_names(index: SampleIndex, root: str) -> list[str]:
    """Every sample's name relative to dataset.root, as `fastloader check` and dataset.exclude write
    them (`train/cat/x.jpg`, `shards/train-000.tar:cat/x.jpg`); a source's samples by the names its
    samples() gave them, which do not change with the folder the job runs in."""
    if index.reader:
        return [os.path.normpath(index.relpath(i)) for i in range(len(index))]
    prefix = os.path.normpath(os.path.relpath(index.root, root))
    head = "" if prefix == "." else prefix + os.sep
    data, bounds = index.path_bytes.tobytes(), index.offsets.tolist()
    names = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        name = data[a:b].decode("utf-8", "surrogateescape")
        names.append(os.path.normpath(os.path.relpath(name, root)) if name[:1] == os.sep else head + name)
    return names


def _class_weights(config: Config, split: SplitConfig, index: SampleIndex, by_source: bool) -> np.ndarray:
    """float64 [len(index)]: each sample's class weight: 1 / its class's size (inverse), 1 / sqrt of it,
    or the mapping's (classes it leaves out weigh 1); a class the split lacks is refused. `by_source`
    (weighted sources): a class's size within each source, so that each source is balanced within its share."""
    key = f"{split.name}.class_weights"
    choice = split.class_weights
    if choice in ("inverse", "sqrt"):
        classes = len(index.classes)
        group = index.labels + (index.entry.astype(np.int64) * classes if by_source else 0)
        counts = np.bincount(group, minlength=classes).astype(np.float64)
        scale = counts if choice == "inverse" else np.sqrt(counts)
        return np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)[group]
    names = {name: label for label, name in enumerate(index.classes)}
    unknown = [name for name in choice if name not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(names), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        shown = ", ".join(index.classes[:8]) + (" ..." if len(index.classes) > 8 else "")
        raise ConfigError(f"{config.origin(key)}: {key}: {unknown[0]!r} is not a class of split '{split.name}'{hint} "
                          f"Its classes: {shown}. Name classes as loader.classes lists them")
    weights = np.ones(len(index.classes), dtype=np.float64)
    for name, weight in choice.items():
        weights[names[name]] = weight
    return weights[index.labels]


def _source_shares(config: Config, split: SplitConfig, index: SampleIndex, weights: np.ndarray) -> np.ndarray:
    """The samples' weights scaled so that each source's add up to its share of the sources' weights."""
    shares = _relative(np.array([source.weight for source in split.sources], dtype=np.float64))
    shares /= shares.sum()
    highest = np.zeros(len(shares))
    np.maximum.at(highest, index.entry, weights)
    weights = weights / np.where(highest > 0, highest, 1.0)[index.entry]  # each source's own scale: sums >= 1
    totals = np.bincount(index.entry, weights=weights, minlength=len(shares))
    empty = np.flatnonzero((totals <= 0) & (shares > 0))
    if len(empty):
        number = int(empty[0])
        key = f"{split.name}.sources[{number}].weight"
        why = "it has no sample left" if not (index.entry == number).any() else \
            f"each of its samples weighs 0 ({' and '.join(k for k in draws_from(split) if not k.endswith('weight'))})"
        raise ConfigError(f"{config.origin(key)}: {key}: {split.sources[number].weight:g}, but {why}, so its share "
                          f"cannot be drawn; set {key}: 0, or give its samples weights above 0")
    scale = np.divide(shares, totals, out=np.zeros_like(shares), where=totals > 0)
    return weights * scale[index.entry]


def _relative(weights: np.ndarray) -> np.ndarray:
    """Weights divided by the largest: the same proportions, and sums and products that stay finite
    and above 0 however large or small the weights a file gives (1e308 each would sum to inf)."""
    highest = weights.max(initial=0.0)
    return weights / highest if highest > 0 else weights


def class_shares(index: SampleIndex, probabilities: np.ndarray) -> str:
    """The expected share of each class among the draws: every class when few, else the most and the
    least drawn (`a 50.0%, b 25.0%, ...`)."""
    shares = np.bincount(index.labels, weights=probabilities, minlength=len(index.classes))
    return describe_shares(index.classes, shares)


def describe_shares(classes: Sequence[str], shares: np.ndarray) -> str:
    if len(classes) <= MANY_CLASSES:
        return ", ".join(f"{name} {_percent(share)}" for name, share in zip(classes, shares.tolist()))
    ranked = np.argsort(-np.round(shares, 12), kind="stable")  # ties (the sums' last bits aside) in label order
    most = ", ".join(f"{classes[c]} {_percent(shares[c])}" for c in ranked[:SHOWN].tolist())
    least = ", ".join(f"{classes[c]} {_percent(shares[c])}" for c in ranked[::-1][:SHOWN].tolist())
    return (f"{len(classes)} classes, {_percent(1 / len(classes))} each if balanced; most drawn: {most}; least "
            f"drawn: {least}")


def _percent(share: float) -> str:
    """A share as people read it: 12.5%, 0.04%, 0.0008%."""
    percent = 100 * float(share)
    return f"{percent:.1f}%" if percent >= 0.1 or percent == 0 else f"{percent:.2g}%"
