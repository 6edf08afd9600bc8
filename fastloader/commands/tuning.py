"""The search behind `fastloader tune`: the backend and the loader's widths and depths measured on
this machine, for this config's data, within this rank's share of the node.

Why a search of this shape (tf.data's AUTOTUNE, Plumber, MLSys 2022): a blind grid costs a trial per
point and most points are far off. So the search first measures what one core does per image in
each stage (the torch backend in-process, once unprofiled for the rate, once under cProfile for the
shares), and starts each backend where that says its parallelism pays; then it hill-climbs one knob
at a time, keeping a move only where it gains more than the noise (MIN_GAIN) and rolling it back
otherwise. The fastest few (FINALISTS) are measured again, in turns, and the cheapest of those within
PICK of the best median is chosen: fewer processes and threads, less memory, for the same rate.

Only keys that change how fast batches come are searched (config_tuned.TUNABLE_KEYS); DALI's
fancy_upsampling is left as the config gives it, since it changes the pixels nvJPEG delivers.
"""
from __future__ import annotations

import cProfile
import math
import os
import pstats
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import load_config
from ..config_dump import config_to_raw
from ..config_tuned import MEASURED_ON, data_format, machine_key, nested
from ..errors import ConfigError
from ..machine import available_memory, human_bytes, usable_cores
from ..words import plural
from . import no_batch_error
from .bench import Run, peak_gpu_bytes, synchronize

MIN_GAIN = 0.03
"""A hill-climbing move is kept where it gains more than this share (below it: noise, rolled back)."""
FINALISTS = 4
"""The settings measured again, the fastest first..."""
FINALIST_FLOOR = 0.4
"""... of those at this share of the best rate or more (a busy neighbour can halve a round's rate)."""
REPEATS = 2
"""Rounds more for each finalist: the choice is on the median of three."""
PICK = 0.02
"""The cheapest setting within this share of the best rate is chosen."""
CLIMB_SHARE = 0.55
"""The share of the time limit the hill-climbing may take; the rest is left to measure the close ones again."""
MEMORY_SHARE = 0.8
"""A setting may hold at most this share of the memory available to the rank (its share of the node's)."""
GPU_SHARE = 0.25
"""A setting may hold at most this share of the rank's GPU's memory: the rest is the model's."""
MAX_FEED_PROCESSES = 4
"""The most DALI feed processes tried (past the reading stage's need they only take cores)."""
STAGES = ("read", "decode", "ops", "collate", "feed + copy")
"""Where an image's time goes, as the tune report names the stages."""


@dataclass(frozen=True)
class Setting:
    """A backend and the values of the tunable keys the search gives it (dotted keys)."""
    backend: str
    values: tuple[tuple[str, Any], ...]

    def get(self, key: str) -> Any:
        return dict(self.values)[key]

    def but(self, key: str, value: Any) -> Setting:
        return Setting(self.backend, tuple(sorted({**dict(self.values), key: value}.items())))

    def overrides(self) -> dict[str, Any]:
        return {"backend": self.backend, **dict(self.values)}

    def cost(self) -> tuple:
        """What the setting takes from the machine, least first: processes and threads, then the
        batches it holds ahead (memory)."""
        values = dict(self.values)
        width = values.get("workers.num_workers", 0) if self.backend == "torch" else \
            values.get("dali.threads", 1) + values.get("dali.feed_processes", 0)
        return (width, values.get("workers.prefetch_factor", 2), self.backend != "torch")

    def label(self) -> str:
        values = dict(self.values)
        if self.backend == "torch":
            words = [plural(values.get("workers.num_workers"), "worker")]
        else:
            words = [plural(values.get("dali.threads"), "thread")]
            if values.get("dali.feed_processes"):
                words.append(plural(values["dali.feed_processes"], "feed process"))
            if "dali.hw_decoder_load" in values:
                words.append(f"hw_decoder_load {values['dali.hw_decoder_load']}")
        words.append(f"prefetch {values.get('workers.prefetch_factor')}")
        if values.get("workers.pin_memory") not in (None, "auto"):
            words.append(f"pin_memory {values['workers.pin_memory']}")
        return f"{self.backend}: " + ", ".join(words)


@dataclass
class Trial:
    """What one setting measured: its rounds' images/s, and the memory it held."""
    setting: Setting
    label: str
    rates: list[float] = field(default_factory=list)
    memory: int = 0
    gpu_memory: int | None = None
    refused: str | None = None

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0


@dataclass
class Budget:
    """This rank's share of the node: its cores, memory, and GPU memory."""
    cores: int
    memory: int
    gpu_memory: int | None


@dataclass
class Profile:
    """One core's work per image, in ms, by stage (STAGES), from the torch backend in-process."""
    ms: dict[str, float]
    rate: float
    """Images/s of the in-process loader, unprofiled: one core's rate."""

    @property
    def worker_ms(self) -> float:
        return sum(self.ms[s] for s in STAGES[:4])


@dataclass
class Result:
    given: Trial
    chosen: Trial
    trials: list[Trial]
    profile: Profile | None
    budget: Budget
    measured_on: dict
    seconds: float
    step_ms: float | None = None
    batch_size: int = 0

    def settings(self) -> dict[str, Any]:
        """The tuned file's content: the chosen keys nested as in a config, and what they were measured on."""
        return nested({**self.chosen.setting.overrides(), MEASURED_ON: self.measured_on})


class Tuner:
    """Measures settings of one config's split, each in a fresh loader, within a budget."""

    def __init__(self, config, split: str, seconds: float, budget: Budget, say: Callable[[str], None] = print):
        self.config = load_config(config, {"stats.log_level": "none"}, origin="fastloader tune (it reports per trial)")
        self.split, self.seconds, self.budget, self.say = split, seconds, budget, say
        self.trials: dict[Setting, Trial] = {}
        self.dali_runs = _dali_runs(self.config)

    def loader(self, overrides: dict[str, Any]):
        from .. import build_loader
        return build_loader(self.config, self.split, overrides=overrides)

    def measure(self, setting: Setting, again: bool = False) -> Trial:
        """One timed round of the setting (a fresh loader, its prefetched batches drained untimed first);
        a setting measured before is measured again only when `again`."""
        with warnings.catch_warnings():  # torch's advice against more workers than cores: trying them is the point
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            return self._measure(setting, again)

    def _measure(self, setting: Setting, again: bool) -> Trial:
        trial = self.trials.get(setting)
        if trial is not None and not again:
            return trial
        started = time.perf_counter()
        try:
            loader = self.loader(setting.overrides())
        except ConfigError as error:
            trial = self.trials[setting] = Trial(setting, setting.label(), refused=str(error))
            self.say(f"  {setting.label():<52} not built: {error}")
            return trial
        try:
            if len(loader) == 0:
                raise no_batch_error(loader)
            run = Run(loader, time.perf_counter() - started, 0.0)
            depth = loader.prefetch_depth
            _reset_gpu_peak(loader.device)
            timed = run.round(warmup=1, min_batches=max(2, depth), min_seconds=self.seconds)
            synchronize(loader.device)
            trial = self.trials.setdefault(setting, Trial(setting, _label(loader, setting)))
            trial.rates.append(timed.images_per_second)
            trial.memory = max(trial.memory, run.peak_memory)
            trial.gpu_memory = peak_gpu_bytes(loader.device)
        finally:
            loader.close()
        trial.refused = self._over_budget(trial)
        note = f"  (over budget: {trial.refused})" if trial.refused else ""
        self.say(f"  {trial.label:<52} {timed.images_per_second:7.0f} images/s, {human_bytes(trial.memory)}{note}")
        return trial

    def _over_budget(self, trial: Trial) -> str | None:
        if trial.memory > self.budget.memory:
            return f"{human_bytes(trial.memory)} of memory, over the rank's {human_bytes(self.budget.memory)}"
        if trial.gpu_memory and self.budget.gpu_memory and trial.gpu_memory > self.budget.gpu_memory:
            return (f"{human_bytes(trial.gpu_memory)} of GPU memory, over the rank's "
                    f"{human_bytes(self.budget.gpu_memory)}")
        return None

    def profile(self) -> Profile:
        """One core's ms per image in each stage: the torch backend without workers, a round timed
        unprofiled (its rate), then one under cProfile (the stages' shares of that time), with one
        torch thread, as a worker has."""
        import torch
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        profiler = cProfile.Profile()
        try:
            with self.loader({"backend": "torch", "workers.num_workers": 0}) as loader:
                run = Run(loader, 0.0, 0.0)
                plain = run.round(warmup=1, min_batches=2, min_seconds=self.seconds / 2)
                profiler.enable()
                started = time.perf_counter()
                run.round(warmup=0, min_batches=2, min_seconds=self.seconds / 2)
                wall = time.perf_counter() - started
                profiler.disable()
        finally:
            profiler.disable()
            torch.set_num_threads(threads)
        shares = stage_shares(pstats.Stats(profiler), wall)
        ms_per_image = 1000 / plain.images_per_second if plain.images_per_second > 0 else float("nan")
        return Profile({stage: share * ms_per_image for stage, share in shares.items()}, plain.images_per_second)

    def starts(self, given: Setting, profile: Profile | None) -> list[Setting]:
        """Where each backend's climb starts: the widths the per-stage rates say pay on this budget."""
        cores = self.budget.cores
        prefetch = given.get("workers.prefetch_factor")
        main_share = 0.0 if profile is None else profile.ms["feed + copy"] / max(1e-9, sum(profile.ms.values()))
        # the workers take the cores the main process leaves; one more where reading waits on the disk
        workers = max(1, min(2 * cores, round(cores * (1 - main_share) + (0.5 if _reads_wait(profile) else 0))))
        starts = [Setting("torch", (("workers.num_workers", workers), ("workers.pin_memory", "auto"),
                                    ("workers.prefetch_factor", prefetch)))]
        if self.dali_runs:
            gpu = self._dali_on_gpu()
            feed = 0 if not gpu or profile is None else \
                min(MAX_FEED_PROCESSES, math.ceil(cores * profile.ms["read"] / max(1e-9, profile.worker_ms)))
            values = {"dali.threads": cores, "dali.feed_processes": feed, "workers.prefetch_factor": prefetch}
            if gpu:
                values["dali.hw_decoder_load"] = self.config.dali.hw_decoder_load
            starts.append(Setting("dali", tuple(sorted(values.items()))))
        return starts

    def _dali_on_gpu(self) -> bool:
        import torch
        return torch.cuda.is_available() and self.config.output.device != "cpu"

    def neighbours(self, setting: Setting) -> list[Setting]:
        """One knob moved one step: more parallelism first (what most often pays), then less, then a deeper queue."""
        cores, found = self.budget.cores, []
        values = dict(setting.values)
        if setting.backend == "torch":
            workers = values["workers.num_workers"]
            found += [setting.but("workers.num_workers", w) for w in (workers + 1, workers - 1) if 0 <= w <= 2 * cores]
            if self._dali_on_gpu():
                found.append(setting.but("workers.pin_memory", values["workers.pin_memory"] is False))
        else:
            threads, feed = values["dali.threads"], values["dali.feed_processes"]
            found += [setting.but("dali.threads", t) for t in (threads + 1, threads - 1) if 1 <= t <= 2 * cores]
            if self._dali_on_gpu():
                found += [setting.but("dali.feed_processes", f) for f in (feed + 1, feed - 1)
                          if 0 <= f <= MAX_FEED_PROCESSES]
                load = values["dali.hw_decoder_load"]
                found += [setting.but("dali.hw_decoder_load", round(v, 2)) for v in (load + 0.2, load - 0.2)
                          if 0 <= v <= 1]
        # deeper only: a shallower queue saves a batch or two of memory and risks the overlap (DALI's queue of 1
        # measured 0.86x its queue of 2 in benchmarks/tune.py); a setting over the memory budget is refused anyway
        prefetch = values["workers.prefetch_factor"]
        found += [setting.but("workers.prefetch_factor", prefetch * 2)] if prefetch * 2 <= 8 else []
        return found

    def climb(self, start: Setting, deadline: float) -> Trial:
        """First-improvement hill-climbing: a move kept where it gains more than MIN_GAIN, else rolled back."""
        current = self.measure(start)
        improved = True
        while improved and time.perf_counter() < deadline:
            improved = False
            for candidate in self.neighbours(current.setting):
                if candidate in self.trials or time.perf_counter() >= deadline:
                    continue
                trial = self.measure(candidate)
                if not trial.refused and trial.rate > current.rate * (1 + MIN_GAIN):
                    self.say(f"    kept: {trial.rate / max(current.rate, 1e-9):.2f}x")
                    current, improved = trial, True
                    break
        return current

    def tune(self, time_limit: float) -> tuple[Trial, Trial, Profile | None]:
        """(the config as given, the chosen setting, the per-stage profile)."""
        started = time.perf_counter()
        deadline = started + time_limit
        given = self.given()
        self.say("trials (images/s of one round each, its prefetched batches drained first):")
        self.measure(given)
        self.say("measuring one core's work per image in each stage (torch backend, no workers) ...")
        profile = self.profile()
        starts = [self.measure(start) for start in self.starts(given, profile)]
        ranked = sorted((t for t in starts if not t.refused and t.rates), key=lambda t: -t.rate)
        for start in ranked:  # the best start first; one round apart in time, a backend's start may be unlucky
            self.climb(start.setting, started + CLIMB_SHARE * time_limit)  # the rest: measuring the close ones again
        usable = [t for t in self.trials.values() if not t.refused and t.rates]
        best = max(t.rate for t in usable)
        # the fastest few, not only the close ones: a best that one lucky round put far ahead is checked
        # too; and each backend's best, so that the backends are compared in the same turns, not minutes apart
        fastest = sorted((t for t in usable if t.rate >= best * FINALIST_FLOOR), key=lambda t: -t.rate)
        each = [next(t for t in fastest if t.setting.backend == name) for name in
                dict.fromkeys(t.setting.backend for t in fastest)]
        close = [self.trials[setting] for setting in dict.fromkeys(t.setting for t in each + fastest)]
        close = close[:max(FINALISTS, len(each))]
        if len(close) > 1:
            self.say(f"measuring the {len(close)} fastest settings again, in turns:")
            for number in range(REPEATS):  # the order reversed each turn, so that a noisy spell hits them alike
                for trial in close if number % 2 == 0 else close[::-1]:
                    if time.perf_counter() < deadline:
                        self.measure(trial.setting, again=True)
        best = max(t.rate for t in close)
        chosen = min((t for t in close if t.rate >= best * (1 - PICK)), key=lambda t: t.setting.cost())
        return self.trials[given], chosen, profile

    def given(self) -> Setting:
        """The config's own values of the keys searched, as the config gives them ('auto' kept)."""
        backend = self.config.backend
        if backend == "auto":
            from ..distributed import detect_ranks
            from ..factory import choose_backend, choose_device
            backend = choose_backend(self.config, choose_device(self.config,
                                                                detect_ranks(*self.config.distributed.given())))[0]
        raw = config_to_raw(self.config)
        if backend == "torch":
            keys = ("workers.num_workers", "workers.pin_memory", "workers.prefetch_factor")
        else:
            keys = ("dali.threads", "dali.feed_processes", "workers.prefetch_factor",
                    *(("dali.hw_decoder_load",) if self._dali_on_gpu() else ()))
        return Setting(backend, tuple(sorted((key, raw[key.split(".")[0]][key.split(".")[1]]) for key in keys)))


def stage_shares(stats: pstats.Stats, wall: float) -> dict[str, float]:
    """The shares of the in-process loop's time in each stage, from the cumulative times of the
    functions that run them (the backend's, named by file and function: fastloader imports no
    backend). What none of them covers is the main process's own: the feed and the copy out."""
    def cumulative(path_end: str, *names: str) -> float:
        return sum(row[3] for (path, _, name), row in stats.stats.items()
                   if path.replace(os.sep, "/").endswith(path_end) and name in names)
    read = cumulative("sources/reading.py", "read_bytes")
    decode = cumulative("decoding/decode.py", "load_region") - read
    sample = cumulative("torch_loader/dataset.py", "_decode")
    ops = sample - read - decode
    collate = cumulative("torch_loader/collate.py", "__call__", "fast_collate")
    total = max(wall, read + decode + ops + collate, 1e-9)
    parts = {"read": read, "decode": decode, "ops": ops, "collate": collate}
    parts["feed + copy"] = max(0.0, total - sum(parts.values()))
    return {stage: max(0.0, value) / total for stage, value in parts.items()}


def _reads_wait(profile: Profile | None) -> bool:
    """Reading takes a fifth of the work or more: a worker more than the cores overlaps the waits."""
    return profile is not None and profile.ms["read"] >= 0.2 * max(1e-9, profile.worker_ms)


def _label(loader, setting: Setting) -> str:
    """The setting as the loader resolved it (auto values as numbers)."""
    info = loader.describe()
    if setting.backend == "torch":
        resolved = setting.but("workers.num_workers", info["workers"])
    else:
        resolved = setting.but("dali.threads", info["threads"]).but("dali.feed_processes", info["feed_processes"])
    return resolved.label()


def _dali_runs(config) -> bool:
    """Whether the DALI backend can be built here (it imports, recent enough)."""
    import torch

    from ..factory import choose_backend
    try:
        choose_backend(load_config(config, {"backend": "dali"}), torch.device("cpu"))
    except ConfigError:
        return False
    return True


def _reset_gpu_peak(device) -> None:
    if device.type == "cuda":
        import torch
        torch.cuda.reset_peak_memory_stats(device)



def budget_for(ranks_per_node: int, device_index: int | None = None) -> Budget:
    """This rank's share of the node: its cores (at least one), memory and GPU memory."""
    share = max(1, ranks_per_node)
    gpu = None
    if device_index is not None:
        import torch
        gpu = int(torch.cuda.get_device_properties(device_index).total_memory * GPU_SHARE)  # a rank has its own GPU
    return Budget(max(1, usable_cores() // share), int(available_memory() * MEMORY_SHARE / share), gpu)


def tune(config, split: str = "train", seconds: float = 2.0, ranks_per_node: int = 1, time_limit: float = 125.0,
         step_ms: float | None = None, say: Callable[[str], None] = print) -> Result:
    """Measure and choose the loader settings for `config`'s split on this machine (the search above),
    within this rank's share of the node (its cores by affinity, so that the trials use no more)."""
    from ..distributed import detect_ranks
    from ..factory import choose_device
    loaded = load_config(config)
    measured_on = machine_key(ranks_per_node, data_format(loaded.dataset.format, bool(loaded.dataset.cache)))
    budget = budget_for(ranks_per_node, choose_device(loaded, detect_ranks(*loaded.distributed.given())).index)
    affinity = _narrow_to(budget.cores)
    try:
        tuner = Tuner(loaded, split, seconds, budget, say)
        given, chosen, profile = tuner.tune(time_limit)
    finally:
        _restore(affinity)
    return Result(given, chosen, list(tuner.trials.values()), profile, budget, measured_on, seconds, step_ms,
                  loaded.split(split).batch_size)


def _narrow_to(cores: int) -> list[int] | None:
    """Run on the first `cores` of this process's cores (a rank's share); the cores before, to restore."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    before = sorted(os.sched_getaffinity(0))
    if cores < len(before):
        os.sched_setaffinity(0, before[:cores])
    return before


def _restore(affinity: list[int] | None) -> None:
    if affinity is not None:
        os.sched_setaffinity(0, affinity)


def report_lines(result: Result) -> list[str]:
    """What the command prints after the trials: each setting's rate against the config as given,
    the choice, where its time goes, and with a model step, whether the job is data-bound at all."""
    given = result.given.rate or float("nan")
    lines = [f"budget: {result.budget.cores} of this node's {result.measured_on['cores']} cores "
             f"({result.measured_on['ranks_per_node']} rank(s) per node), {human_bytes(result.budget.memory)} memory"
             + (f", {human_bytes(result.budget.gpu_memory)} GPU memory" if result.budget.gpu_memory else ""),
             "tried (median of each setting's rounds; x: against the config as given):"]
    for trial in sorted(result.trials, key=lambda t: -t.rate):
        mark = "chosen" if trial is result.chosen else ("as given" if trial is result.given else "")
        rounds = f"{len(trial.rates)} round{'s' if len(trial.rates) != 1 else ''}"
        why = f" over budget: {trial.refused}" if trial.refused else ""
        lines.append(f"  {trial.label:<52} {trial.rate:7.0f} images/s {trial.rate / given:5.2f}x  {rounds:<8} "
                     f"{mark}{why}")
    chosen = result.chosen
    lines.append(f"chosen: {chosen.label}: {chosen.rate:.0f} images/s, {chosen.rate / given:.2f}x the config as given "
                 f"({result.given.label}, {result.given.rate:.0f} images/s); the cheapest within {PICK:.0%} of "
                 f"the best")
    if result.profile is not None:
        profile = result.profile
        total = sum(profile.ms.values())
        lines.append(f"where the time goes: one core's ms per image, the torch backend in-process "
                     f"({profile.rate:.0f} images/s on one core):")
        lines.append("  " + ", ".join(f"{stage} {ms:.2f} ({ms / total:.0%})" for stage, ms in profile.ms.items()))
        if chosen.setting.backend == "torch":
            workers = chosen.setting.get("workers.num_workers") or 1
            lines.append(f"  the chosen {workers} worker(s) at that rate: at most "
                         f"{1000 * workers / max(profile.worker_ms, 1e-9):.0f} images/s from read + decode + ops + "
                         f"collate, on {result.budget.cores} core(s); measured {chosen.rate:.0f}")
        else:
            lines.append("  (DALI runs these stages in its own threads; the torch backend's split shows the work)")
    if result.step_ms:
        consumer = 1000 * result.batch_size / result.step_ms
        lines.append(data_bound(consumer, result.given.rate, chosen.rate, result.step_ms))
    return lines


def data_bound(consumer: float, given: float, chosen: float, step_ms: float) -> str:
    """Whether a model step of `step_ms` (`consumer` images/s) waits for the loader, as given and tuned."""
    head = f"a model step of {step_ms:g} ms takes {consumer:.0f} images/s; "
    if given >= consumer:
        return (head + f"the config as given already delivers {given:.0f}: the job is not data-bound, and tuning the "
                f"loader does not make it faster")
    wait = 1 - chosen / consumer
    if chosen >= consumer:
        return head + (f"as given the loader delivers {given:.0f} (the model waits {1 - given / consumer:.0%} of the "
                       f"time); tuned {chosen:.0f}: no longer data-bound")
    return head + (f"the job is data-bound: tuned the loader delivers {chosen:.0f}, so the model still waits "
                   f"{wait:.0%} of the time (more cores per rank, a uint8 cache (fastloader cache) or the DALI GPU "
                   f"flavour help)")


def step_ms_of(step: Callable[[Any], Any], config, split: str = "train", batches: int = 5) -> float:
    """A model step's ms per batch, timed on real batches of the split (the first one untimed): what
    `tune(..., step_ms=...)` compares the loader with, for a model given from Python."""
    from .. import build_loader
    with build_loader(config, split) as loader:
        times, stream = [], iter(loader)
        for number, (images, labels) in zip(range(batches + 1), stream):
            started = time.perf_counter()
            step(images)
            synchronize(loader.device)
            if number:
                times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times) if times else float("nan")
