"""The config's rules across keys, each checked once the keys it reads are built: a size schedule
that can be followed, a split's sources, `shuffle: block` over shards, weighted draws over a uniform
order. Each takes `fail(dotted_key, message)`, which raises the ConfigError naming where the key
was set (config_build.ConfigBuilder.fail).
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Callable, Mapping, NoReturn

from .schema import ENTRY_KINDS, MAX_VIEWS, SOURCE_KINDS, DaliConfig, DatasetConfig, SplitConfig, TransformConfig
from .sources.registry import FORMATS
from .sources.urls import is_url
from .words import plural

Fail = Callable[[str, str], NoReturn]


def block_order_needs_shards(fail: Fail, dataset: DatasetConfig, splits: Mapping[str, SplitConfig]) -> None:
    """`shuffle: block` reads a split's shards block by block: image files have none to group."""
    for name, split in splits.items():
        if split.shuffle == "block" and split.sources is not None:
            files = next((k for k, source in enumerate(split.sources)
                          if source.shards is None and source.files is None), None)
            if files is not None:
                fail(f"{name}.shuffle", f"block reads the split's tar shards (or parquet row groups) block by "
                                        f"block, and {name}.sources[{files}] reads image files, which have "
                                        f"no shards to group; set {name}.shuffle: true, or pack that source "
                                        f"into shards with `fastloader pack`")
            continue
        if split.shuffle == "block" and split.source is not None:
            fail(f"{name}.shuffle", f"block reads the split's tar shards block by block, and {name}.source reads "
                                    f"samples one by one, which have no shards to group; set {name}.shuffle: true")
        elif split.shuffle == "block" and dataset.format in FORMATS and not FORMATS[dataset.format].containers:
            what = "image files" if dataset.format == "folder" else "samples that are no byte ranges of shards"
            fail(f"{name}.shuffle", f"block reads the split's tar shards block by block, and dataset.format: "
                                    f"{dataset.format} reads {what}, which have no shards to group; set "
                                    f"{name}.shuffle: true (a uniform permutation costs them nothing more), or pack "
                                    f"the split into shards with `fastloader pack` and read them with "
                                    f"dataset.format: webdataset")


def source_keys(fail: Fail, name: str, values: dict) -> None:
    """A split's own `source` says where all its samples are: no folder, file list, shards, files or
    sources beside it; `source_args` are its factory's (or a format of the user's) arguments."""
    if values.get("source") is not None:
        for key in (*SOURCE_KINDS, "sources"):
            if values.get(key) is not None:
                fail(f"{name}.{key}", f"split '{name}' reads its samples from {name}.source; remove {name}.{key}, "
                                      f"or remove {name}.source")


def check_holdouts(fail: Fail, splits: Mapping[str, SplitConfig]) -> None:
    """A split held out of another reads that split's samples, so it names no samples of its own; the
    other split is one of the config's, not held out itself (its samples are the ones chosen from); a
    share or a count per class, one of them."""
    for name, split in splits.items():
        holdout = split.held_out
        if holdout is None:
            continue
        key = f"{name}.held_out"
        for own in (*SOURCE_KINDS, "source", "sources"):
            if getattr(split, own) is not None:
                fail(f"{name}.{own}", f"split '{name}' is held out of split '{holdout.of}' ({key}.of), whose "
                                      f"samples it reads; remove {name}.{own}, or remove {key}")
        if holdout.of == name or holdout.of not in splits:
            others = [other for other in splits if other != name]
            close = difflib.get_close_matches(holdout.of, others, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            what = "this split itself" if holdout.of == name else "no split of the config"
            fail(f"{key}.of", f"names {what} ({holdout.of!r}){hint}; name the split whose samples are held out: "
                              f"one of {', '.join(others) or 'none (add a train section)'}")
        if splits[holdout.of].held_out is not None:
            first = splits[holdout.of].held_out.of
            fail(f"{key}.of", f"names split '{holdout.of}', which is itself held out of split '{first}'; hold both "
                              f"out of '{first}'")
        if (holdout.fraction is None) == (holdout.count is None):
            fail(key, f"takes a share of each class ({key}.fraction: 0.1) or a count of each class ({key}.count: "
                      f"50), one of the two; {'both are' if holdout.count is not None else 'neither is'} set")


def draws_need_a_uniform_order(fail: Fail, splits: Mapping[str, SplitConfig]) -> None:
    """Weights draw at random: `shuffle: false` cannot keep the index order, and the block order is
    refused with them (docs/semantics.md, the block order: grouped by block, the draws of a rare
    sample would crowd the few blocks that hold it). An epoch_size alone takes either uniform order."""
    for name, split in splits.items():
        weighted = [f"{name}.{key}" for key in ("weights", "class_weights") if getattr(split, key) is not None]
        if split.sources is not None and any(source.weight is not None for source in split.sources):
            weighted.append(f"{name}.sources[].weight")
        if split.shuffle == "block" and (weighted or split.epoch_size is not None):
            keys = weighted or [f"{name}.epoch_size"]
            fail(f"{name}.shuffle", f"block reads every shard once an epoch, and {', '.join(keys)} draw "
                                    f"samples with replacement (or more than once an epoch): drawn "
                                    f"samples grouped by block would crowd the few blocks that hold a "
                                    f"rare sample (docs/semantics.md, the block order). Set "
                                    f"{name}.shuffle: true, or remove {keys[0]}")
        if split.shuffle is False and weighted:
            fail(f"{name}.shuffle", f"false reads the samples in index order, and {weighted[0]} draws them at "
                                    f"random in proportion to their weights; set {name}.shuffle: true, or "
                                    f"remove {weighted[0]}")


def graph_args_need_a_graph_hook(fail: Fail, dali: DaliConfig | None) -> None:
    """dali.graph_hook_args without dali.graph_hook would be read by nothing."""
    if dali is not None and dali.graph_hook_args and dali.graph_hook is None:
        fail("dali.graph_hook_args", "is set, and dali.graph_hook is not: nothing would read them; set "
                                     "dali.graph_hook: 'package.module:function', or remove dali.graph_hook_args")


def check_sizes(fail: Fail, name: str, t: TransformConfig) -> None:
    """A size schedule that can be followed: a ramp that goes up and ends after it starts; one
    schedule, not two (docs/semantics.md#output-sizes)."""
    ramp, key = t.progressive, f"{name}.transform.progressive"
    if ramp is not None:
        if ramp.min_size > t.size:
            fail(f"{key}.min_size", f"{ramp.min_size} is above {name}.transform.size {t.size}, where the "
                                    f"ramp ends; set min_size <= size (FFCV's ResNet-50: 160 up to 192)")
        if ramp.end_epoch <= ramp.start_epoch:
            fail(f"{key}.end_epoch", f"{ramp.end_epoch} is not after start_epoch {ramp.start_epoch}: the ramp "
                                     f"would end before it starts; set end_epoch > start_epoch")
        if t.sizes is not None:
            fail(f"{name}.transform.sizes", f"a size per batch and {key} are two schedules of one size; "
                                            f"keep one of them")


def check_batch_sizes(fail: Fail, name: str, values: dict) -> None:
    """A batch size per output size (a train split's): one for each of transform.sizes; batch_size,
    what buffers are sized for, the largest of them (set so where the split does not give it)."""
    batch_sizes, sizes, key = values["batch_sizes"], values["transform"].sizes, f"{name}.batch_sizes"
    if sizes is None:
        fail(key, f"pairs a batch size with each of {name}.transform.sizes, which is not set; set "
                  f"{name}.transform.sizes (e.g. [160, 192, 224]) with as many sizes, or remove {key}")
    if len(batch_sizes) != len(sizes):
        fail(key, f"has {plural(len(batch_sizes), 'batch size')} and {name}.transform.sizes "
                  f"{plural(len(sizes), 'size')}: give one batch size per size, in the same order")
    values.setdefault("batch_size", max(batch_sizes))
    if values["batch_size"] != max(batch_sizes):
        fail(f"{name}.batch_size", f"{values['batch_size']} is not the largest of {key} ({max(batch_sizes)}), "
                                   f"which is what the loader's buffers hold; set {name}.batch_size: "
                                   f"{max(batch_sizes)}")


def check_sources(fail: Fail, name: str, mode: str, values: dict) -> None:
    """A split's sources: each says where its samples are with one key; the split itself then says
    nothing of it; weights on every source or on none, not all 0, and none in eval mode; names distinct."""
    sources = values["sources"]
    if not sources:
        return  # refused by its check: a list of at least one
    for key in SOURCE_KINDS:
        if values.get(key) is not None:
            fail(f"{name}.{key}", f"split '{name}' reads its samples from {name}.sources; move {name}.{key} "
                                  f"into a source (e.g. sources: [{{{key}: ...}}]), or remove it")
    for number, source in enumerate(sources):
        kinds = [key for key in ENTRY_KINDS if getattr(source, key) is not None]
        if len(kinds) != 1:
            found = f"it sets {' and '.join(kinds)}" if kinds else "it sets none of them"
            fail(f"{name}.sources[{number}]", f"a source reads one of folder, file_list, shards, files or "
                                              f"source (your own), and {found}; give each source one, e.g. "
                                              f"{{folder: extra/train}}")
        if source.source_args is not None and source.source is None:
            fail(f"{name}.sources[{number}].source_args", f"are the arguments of a source's own factory, and "
                                                          f"this source reads {kinds[0] if kinds else 'nothing'}; "
                                                          f"remove them, or set {name}.sources[{number}].source")
        if source.format is not None and source.files is None:
            fail(f"{name}.sources[{number}].format", "says how a source's `files` are stored (parquet or "
                                                     f"arrow), and this source reads {kinds[0]}; remove it")
        for key in ("shards", "files"):
            if isinstance(getattr(source, key), str):
                source = dataclasses.replace(source, **{key: (getattr(source, key),)})
        sources = (*sources[:number], source, *sources[number + 1:])
    values["sources"] = tuple(sources)
    weighted = [source.weight is not None for source in sources]
    if any(weighted) and mode != "train":
        at = weighted.index(True)
        fail(f"{name}.sources[{at}].weight", f"applies only to train mode, and split '{name}' has mode: "
                                             f"{mode}: eval reads every sample of every source exactly "
                                             f"once; remove the sources' weights, or set {name}.mode: train")
    if any(weighted) and not all(weighted):
        at = weighted.index(False)
        fail(f"{name}.sources[{at}].weight", "missing: set weight on every source (each one's share of the "
                                             "epoch's draws) or on none (the sources read as one split)")
    if all(weighted) and not any(source.weight > 0 for source in sources):
        fail(f"{name}.sources[0].weight", "every source's weight is 0, so no sample could be drawn; give "
                                          "at least one source a weight above 0")
    names = [source.name or f"source{number}" for number, source in enumerate(sources)]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        fail(f"{name}.sources[{len(names) - 1 - names[::-1].index(twice)}].name",
                  f"{twice!r} names two sources; give each source its own name")


def split_format(fail: Fail, dataset: DatasetConfig, splits: Mapping[str, SplitConfig]) -> None:
    """dataset.format is a registered format (sources/registry.py); its splits' source_args are read
    by a split's own source, or by a format that takes them; a root in an object store is read by a
    format that reads stores."""
    if dataset.format not in FORMATS:
        close = difflib.get_close_matches(dataset.format, list(FORMATS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else (
            " (a format of your own is registered by importing its module first: fastloader.sources.register_format)")
        fail("dataset.format", f"expected one of {', '.join(repr(name) for name in FORMATS)}, got "
                               f"{dataset.format!r}{hint}")
    registered = FORMATS[dataset.format]
    for name, split in splits.items():
        if split.source_args is not None and split.source is None and not registered.args:
            fail(f"{name}.source_args", f"are the arguments of {name}.source's factory (or of a format of your own), "
                                        f"and split '{name}' has no source and dataset.format: {dataset.format} takes "
                                        f"none; set {name}.source, or remove {name}.source_args")
    if is_url(dataset.root) and not registered.remote:
        fail("dataset.root", f"{dataset.root!r} is in an object store, which fastloader reads as tar shards or "
                             f"parquet files: set dataset.format: webdataset and each split's shards (pack a folder "
                             f"with `fastloader pack`, then upload the shards)")


def check_views(fail: Fail, name: str, values: dict) -> None:
    """Views (multi-crop) with what has no meaning for them yet: mixing and soft targets (which view's
    pixels would a partner's be mixed into?), a size schedule (each group has its size), repeated
    augmentation (views are repetitions of a sample already); at most MAX_VIEWS views, names distinct."""
    views, key = values["views"], f"{name}.views"
    if sum(group.count for group in views) > MAX_VIEWS:
        fail(key, f"asks for {sum(group.count for group in views)} views of each sample; at most {MAX_VIEWS}")
    names = [group.name or f"view{k}" for k, group in enumerate(views)]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        fail(f"{key}[{names.index(twice, names.index(twice) + 1)}].name", f"'{twice}' names two view groups; give "
                                                                        f"each its own name")
    transform, mixup = values["transform"], values.get("mixup")
    for setting, on in ((f"{name}.transform.sizes", transform.sizes is not None),
                        (f"{name}.transform.progressive", transform.progressive is not None)):
        if on:
            fail(setting, f"a size schedule has no meaning with {key}, where each view group has its own size; "
                          f"remove {setting}, or {key}")
    if values.get("aug_repeats", 1) > 1:
        fail(f"{name}.aug_repeats", f"repeats each sample with a new crop, as {key} does within the sample; remove "
                                    f"{name}.aug_repeats (or set it to 1), or {key}")
    if mixup is not None and (mixup.mixup_alpha > 0 or mixup.cutmix_alpha > 0 or mixup.cutmix_minmax is not None):
        fail(f"{name}.mixup", f"mixing has no meaning yet with {key} (each view would need its own partner's "
                              f"view); remove {name}.mixup, or {key}")
    if values.get("label_smoothing", 0) > 0:
        fail(f"{name}.label_smoothing", f"soft targets are not given with {key}: the batch's labels stay one int64 per "
                                        f"sample; remove {name}.label_smoothing, or {key}")
