"""A loader's saved state: what state_dict records (plain ints and strings), and the checks
load_state_dict makes before it resumes: another split, dataset, seed or order refused, every
number in range, the hooks the same (or forced), a re-sharded resume said with what it leaves out.
"""
from __future__ import annotations

import logging
import numbers

from .errors import StateError
from .loader_setup import LoaderSetup
from .machine import human_bytes
from .schema import INT64_MAX, MAX_BATCH, MAX_PROCESSES, MAX_RANKS
from .words import plural

log = logging.getLogger("fastloader")

STATE_VERSION = 1
BACKEND_NAMES = ("dali", "torch")


def saved_state(loader: LoaderSetup, epoch: int, position: int) -> dict:
    """loader.state_dict() of a loader whose next loop would start at (epoch, position)."""
    return {"version": STATE_VERSION, "backend": loader.backend, "split": loader.split.name,
            "dataset": loader.index.fingerprint, "num_samples": len(loader.index), "seed": loader.config.seed,
            "shuffle": loader.split.shuffle, "block_size": loader.order.blocks.budget if loader.order.blocks else 0,
            "weights": loader.order.draws.digest if loader.order.draws else "",
            "weights_from": loader.order.draws.origin if loader.order.draws else "",
            "epoch_size": loader.order.length, "aug_repeats": loader.order.repeats,
            "sizes": loader.resolution.key() if loader.resolution else f"size {loader.split.transform.size}",
            "epoch": epoch,
            "position": min(position, loader.order.epoch_length),
            "batch_size": loader.batch_size, "world_size": loader.ranks.world_size, "hooks": loader.hooks.state()}


def resume_point(loader: LoaderSetup, state: dict, force_hooks: bool) -> tuple[int, int]:
    """The (epoch, position) a loader resumes a state at, once the state is checked against it (a
    StateError names what differs, and the fix)."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise StateError(f"loader state version {found!r} is not {STATE_VERSION}: pass the dict that "
                         f"loader.state_dict() returned, saved by this fastloader version")
    _refuse_other(loader, state)
    _refuse_out_of_range(loader, state)
    _refuse_other_hooks(loader, state, force_hooks)
    name = loader.split.name
    if state["backend"] != loader.backend:
        log.info("split '%s': resuming a state the %s backend saved on the %s backend: the same samples, crops, "
                 "flips and ops (drawn from each sample's seed), with pixels within the backends' tolerance "
                 "(docs/semantics.md)", name, state["backend"], loader.backend)
    epoch, position = int(state["epoch"]), int(state["position"])
    resharded = (state["world_size"], state["batch_size"]) != (loader.ranks.world_size, loader.batch_size)
    if resharded:
        _warn_left_out(loader, state, epoch, position)
    if loader.order.shared_after(position, epoch) == 0:  # saved at the end of an epoch: go on with the next
        return epoch + 1, 0
    if resharded:
        log.info("split '%s': resuming epoch %d at sample %d of %d with %s x batch %d; the state was "
                 "saved by %s x batch %d, so the rest of the epoch is re-sharded", name, epoch,
                 position, loader.order.epoch_length, plural(loader.ranks.world_size, "rank"), loader.batch_size,
                 plural(state["world_size"], "rank"), state["batch_size"])
    return epoch, position


def _refuse_other(loader: LoaderSetup, state: dict) -> None:
    """A state of another split, dataset, seed or order cannot replay this run's batches. Another
    backend's can: both draw every random choice from the samples' seeds."""
    mine = saved_state(loader, 0, 0)  # its epoch and position unused
    name = loader.split.name
    if state.get("backend") not in BACKEND_NAMES:
        raise StateError(f"loader state names backend {state.get('backend')!r}, not one of "
                         f"{', '.join(BACKEND_NAMES)}: pass the dict that loader.state_dict() returned")
    if state.get("split") != name:
        raise StateError(f"loader state was saved for split {state.get('split')!r}, this loader reads split "
                         f"{name!r}; give each split's loader its own state")
    if state.get("dataset") != mine["dataset"]:
        raise StateError(f"loader state was saved for another dataset: {state.get('num_samples')} samples "
                         f"(fingerprint {state.get('dataset')}) then, {mine['num_samples']} samples "
                         f"(fingerprint {mine['dataset']}) in {loader.index.root} now; files were added, removed "
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
                         f"loader draws with {now} (digest {mine['weights'] or '-'}, from {loader.config.source}); "
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
                         f"{config_key}: {mine[key]!r} (from {loader.config.source}); set it back to "
                         f"resume the same order")


def _refuse_other_hooks(loader: LoaderSetup, state: dict, force: bool) -> None:
    """The hooks a state was saved with against this loader's (a state from before hooks: none)."""
    saved, mine = state.get("hooks", {}), loader.hooks.state()
    if not isinstance(saved, dict) or not all(isinstance(v, str) for v in saved.values()):
        raise StateError(f"loader state: hooks must be a mapping of hook kinds to names, got {saved!r}; pass the "
                         f"dict that loader.state_dict() returned")
    if saved == mine:
        return
    differ = "; ".join(f"{kind}: {saved.get(kind, 'none')} then, {mine.get(kind, 'none')} now"
                       for kind in sorted(set(saved) | set(mine)) if saved.get(kind) != mine.get(kind))
    if force:
        log.warning("split '%s': resuming with other hooks than the state's (%s), as force_hooks asks: the "
                    "samples and fastloader's own draws replay, the hooks' do not", loader.split.name, differ)
        return
    raise StateError(f"loader state was saved with other hooks ({differ}): their draws would not replay. Give "
                     f"the same hooks (a hook's `version` attribute names a change), or pass force_hooks=True to "
                     f"load_state_dict to resume anyway")


def _refuse_out_of_range(loader: LoaderSetup, state: dict) -> None:
    """Every number of the state, checked against this loader: a position of -8 would deliver 8
    samples twice, an epoch past int64 fails deep in numpy. A ValueError names the field and its range."""
    epoch_length = loader.order.epoch_length
    ranges = {"epoch": (0, INT64_MAX, "epochs count from 0"),
              "position": (0, epoch_length, f"samples of the epoch's order consumed by all ranks; split "
                                            f"'{loader.split.name}' has {epoch_length} per epoch"),
              "batch_size": (1, MAX_BATCH, "samples per batch on each rank"),
              "world_size": (1, MAX_RANKS, "ranks"),
              "num_samples": (0, INT64_MAX, "samples in the split"),
              "seed": (0, INT64_MAX, "the config's seed"),
              "aug_repeats": (1, MAX_PROCESSES, f"{loader.split.name}.aug_repeats"),
              "block_size": (0, INT64_MAX, f"bytes of {loader.split.name}.block_size; 0: no blocks"),
              "epoch_size": (1, INT64_MAX, f"positions of an epoch's order ({loader.split.name}.epoch_size)")}
    for key in ("weights", "weights_from"):
        if not isinstance(state.get(key, ""), str):
            raise StateError(f"loader state: {key} must be a string (the sample weights' digest and keys), got "
                             f"{state.get(key)!r}; pass the dict that loader.state_dict() returned")
    if not isinstance(state.get("shuffle"), bool) and state.get("shuffle") != "block":
        raise StateError(f"loader state: shuffle must be true, false or 'block' ({loader.split.name}.shuffle), got "
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


def _warn_left_out(loader: LoaderSetup, state: dict, epoch: int, position: int) -> None:
    """A resume on other ranks or another batch size that leaves out samples the saved run would
    have read (drop_last takes whole steps only, and the rest of the epoch no longer makes them):
    said, naming the keys, since no whole step can read them."""
    then = loader.order.shared_after(position, epoch, state["world_size"], state["batch_size"])
    now = loader.order.shared_after(position, epoch)
    if now >= then:
        return
    name, left = loader.split.name, loader.order.epoch_length - position
    log.warning("split '%s': resuming epoch %d at sample %d of %d with %s x batch %d leaves out %s that the "
                "state's %s x batch %d would read: %s.drop_last: true takes whole steps only (a batch on every "
                "rank), and the %d samples left do not fill them. To read them, finish the epoch with "
                "%s.batch_size: %d on %s, or set %s.drop_last: false (a last, smaller batch)", name, epoch,
                position, loader.order.epoch_length, plural(loader.ranks.world_size, "rank"), loader.batch_size,
                plural(then - now, "sample"), plural(state["world_size"], "rank"), state["batch_size"], name,
                left, name, state["batch_size"], plural(state["world_size"], "rank"), name)
