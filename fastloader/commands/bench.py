"""`fastloader bench`: iterate a split as a trainer would and report what the trainer waited.

A simulated model step (--step-ms, busy on the output device) stands in for the model, so a loader
that keeps up shows a stall near 0% and one that does not shows how far it falls behind. With
`--backend both`, the two backends run in alternating rounds in one process, so that both see the
same machine state (page cache, clocks, neighbours), and their ratio is printed.

Why each round drains first: a loader prepares batches ahead (torch: workers x prefetch_factor + 1;
DALI: its prefetch queue), also while the other backend has its turn. A round that timed those
would report a rate the loader cannot sustain (16 workers x 2 = 32 ready batches timed in a few
milliseconds). So each round first takes at least `prefetch_depth` batches untimed, then times
batches prepared after it started, for at least --seconds and --batches, across epochs as needed.
"""
from __future__ import annotations

import collections
import json
import os
import time
from array import array

from ..errors import ConfigError
from ..machine import hardware, human_bytes, tree_memory
from ..progress import Progress
from ..schema import BACKEND_ENV
from ..words import plural
from . import no_batch_error

HELP = "iterate a split and report images/s, stall, time to first batch and memory"
EXAMPLES = """  fastloader bench configs/sample.yaml
  fastloader bench configs/sample.yaml --backend both --step-ms 20 --json /tmp/bench.json --plot /tmp/bench.png
  fastloader bench configs/imagenette.yaml --split val --set dataset.root=/data/imagenette2-320 --seconds 10
"""

SHARE_NOTE = 0.10
"""A prefetch depth above this share of a round's timed batches is pointed out: the loader's queue
is full or empty at the round's ends, so its rate is uncertain by up to that share."""


def add_arguments(parser) -> None:
    parser.add_argument("--split", default="train", help="split section to read (default: train)")
    parser.add_argument("--backend", choices=("auto", "torch", "dali", "both"),
                        help="override the config's backend; both: torch and dali in alternating rounds")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="each round times at least this long (default: 2; 0: --batches alone decides)")
    parser.add_argument("--batches", type=int, default=0,
                        help="each round times at least this many batches, epochs repeating as needed "
                             "(default: 10 x the loader's prefetch depth, at least 10)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed batches at the start of each round; raised to the loader's prefetch depth "
                             "(workers x prefetch_factor + 1), so that no round times batches prepared before it began "
                             "(default: 2)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per backend (default: 3)")
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="a simulated model step of this many ms, busy on the output device, after each batch")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of throughput over time and stall per batch")


def run(args) -> int:
    backends = ["torch", "dali"] if args.backend == "both" else [args.backend]
    forced = os.environ.get(BACKEND_ENV)
    if len(backends) == 2 and forced:  # it would run the same backend twice under two names
        raise ConfigError(f"--backend both compares the two backends, but {BACKEND_ENV}={forced} forces every "
                         f"loader onto one; unset {BACKEND_ENV} (or use --backend {forced})")
    for name, value in (("--batches", args.batches), ("--warmup", args.warmup), ("--seconds", args.seconds),
                        ("--step-ms", args.step_ms)):
        if not value >= 0:  # NaN too
            raise ConfigError(f"{name} must be >= 0, got {value:g}")
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {args.rounds}")
    for option, path in (("--json", args.json), ("--plot", args.plot)):  # fail before a long run, not after it
        if path and os.path.isdir(path):
            raise ConfigError(f"{option} {path}: is a folder; name the file to write, e.g. {option} "
                              f"{os.path.join(path, 'bench' + ('.json' if option == '--json' else '.png'))}")
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    runs = []
    try:
        for backend in backends:  # each loader's first batch right after its build: what a trainer waits at start
            runs.append(Run(*build(args, backend), args.step_ms))
            if len(runs[-1].loader) == 0:
                raise no_batch_error(runs[-1].loader)
            runs[-1].first_batch()
        progress = Progress(len(runs) * args.rounds, unit="rounds")
        for number in range(args.rounds):
            order = runs if number % 2 == 0 else runs[::-1]  # alternate, so neither gets a quieter machine
            for bench_run in order:
                timed = bench_run.round(args.warmup, args.batches, args.seconds)
                print(f"round {number + 1}/{args.rounds} {bench_run.loader.backend}: {timed.summary()}", flush=True)
                progress.advance()
        progress.finish()
        report(runs, args)
    finally:
        for bench_run in runs:
            bench_run.loader.close()
    return 0


def build(args, backend: str | None) -> tuple:
    """The loader under test and the seconds build_loader took (torch imported before: a trainer
    has imported it before it builds). The loaders' own per-epoch lines are off: an epoch
    that a round boundary cuts (the other backend's turn, or the next round's drain) would count time
    it did not run; the bench prints one line per round instead, and its table adds those rounds up."""
    from .. import build_loader
    from ..config import load_config
    config = load_config(args.config, args.overrides)
    if backend:
        config = load_config(config, {"backend": backend}, origin=f"the command's --backend {args.backend}")
    config = load_config(config, {"stats.log_level": "none"}, origin="fastloader bench (it reports per round)")
    import torch  # noqa: F401  (seconds on a busy machine, which a trainer spends before its build too)
    started = time.perf_counter()
    return build_loader(config, split=args.split), time.perf_counter() - started


class Round:
    """One timed round: what it drained untimed, then what it timed."""

    def __init__(self, drained: int, min_batches: int, epoch_batches: int):
        self.drained, self.min_batches, self.epoch_batches = drained, min_batches, epoch_batches
        self.images = self.batches = 0
        self.seconds = self.wait_s = 0.0

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds else float("nan")

    @property
    def stall_fraction(self) -> float:
        return self.wait_s / self.seconds if self.seconds else float("nan")

    def summary(self) -> str:
        return (f"{plural(self.images, 'image')} in {plural(self.batches, 'batch')} "
                f"({self.batches / self.epoch_batches:.1f} epochs), {self.seconds:.2f} s: "
                f"{self.images_per_second:.0f} images/s, waited for data {self.stall_fraction:.1%} of the time; "
                f"{plural(self.drained, 'batch')} drained untimed first")

    def as_dict(self) -> dict:
        return {"drained": self.drained, "images": self.images, "batches": self.batches, "seconds": self.seconds,
                "images_per_second": self.images_per_second, "stall_fraction": self.stall_fraction}


class Stream:
    """The loader's batches as one stream, epoch after epoch (a round may end inside one), and the
    images that the loops it finished left to DALI's CPU decoder."""

    def __init__(self, loader):
        self.loader = loader
        self.cpu_decoded: collections.Counter = collections.Counter()
        """The DALI GPU flavour's images left to the CPU decoder in the loops finished (loader.stats.cpu_decoded)."""
        self._batches = self._loops()

    def _loops(self):
        while True:
            for batch in self.loader:
                yield batch
            self.cpu_decoded.update(self.loader.stats.cpu_decoded)

    def next(self):
        return next(self._batches)

    def all_cpu_decoded(self) -> dict[str, int]:
        """cpu_decoded over the whole run: the loops finished and the one under way (the stream is
        paused inside it)."""
        return dict(self.cpu_decoded + collections.Counter(self.loader.stats.cpu_decoded))


class Shapes:
    """The shapes of the batches seen, in order (transform.sizes: several), and the first one's
    shape and dtype, as the report prints them."""

    def __init__(self):
        self.first: list[int] | None = None
        self.dtype: str | None = None
        self.seen: dict[tuple[int, ...], None] = {}

    def saw(self, images) -> None:
        if self.first is None:
            self.first, self.dtype = list(images.shape), str(images.dtype).removeprefix("torch.")
        self.seen[tuple(images.shape)] = None


class Timeline:
    """Each timed batch's wait for data and when it was done, from the first round's start: the plot's."""

    def __init__(self):
        self.wait_s, self.done_s = array("d"), array("d")

    def add(self, wait_s: float, done_s: float) -> None:
        self.wait_s.append(wait_s)
        self.done_s.append(done_s)


class Run:
    """One loader under measurement. Its rounds continue one stream of batches (epochs repeat as
    needed); each round first drains what the loader prepared before it began, untimed."""

    def __init__(self, loader, build_s: float, step_ms: float):
        self.loader, self.build_s = loader, build_s
        self.step = simulated_step(loader.device, step_ms)
        self.stream = Stream(loader)
        self.first_batch_s = float("nan")
        self.shapes = Shapes()
        self.rounds: list[Round] = []
        self.timeline = Timeline()
        self.peak_memory = 0  # bytes, the largest of the samples taken after each round

    def round(self, warmup: int, min_batches: int, min_seconds: float) -> Round:
        """Drain max(warmup, prefetch depth) batches, then time until both floors are met."""
        depth = self.loader.prefetch_depth
        min_batches = min_batches or max(10, 10 * depth)
        clock = time.perf_counter
        timed = Round(max(warmup, depth), min_batches, len(self.loader))
        for _ in range(timed.drained):
            self._next(clock)
        offset = sum(r.seconds for r in self.rounds)
        started = clock()
        while timed.batches < min_batches or clock() - started < min_seconds:
            asked = clock()
            images = self._next(clock)
            arrived = clock()
            self.step(images)
            timed.images += len(images)
            timed.batches += 1
            timed.wait_s += arrived - asked
            self.timeline.add(arrived - asked, offset + clock() - started)
        synchronize(self.loader.device)
        timed.seconds = clock() - started
        self.rounds.append(timed)
        # Reading PSS takes ~10 ms per process, so it is sampled after each round, off the clock.
        self.peak_memory = max(self.peak_memory, tree_memory().pss)
        return timed

    def first_batch(self) -> None:
        """Take the loader's first batch, timed from asking for it: with the build's time, how long a
        trainer waits from build_loader to its first step (the torch workers start in the build)."""
        self._next(time.perf_counter)

    def _next(self, clock):
        asked = clock()
        images, _ = self.stream.next()
        if self.shapes.first is None:
            self.first_batch_s = clock() - asked
        self.shapes.saw(images)
        return images

    def result(self) -> dict:
        from ..config_dump import config_to_dict
        info = self.loader.describe()
        images, batches = sum(r.images for r in self.rounds), sum(r.batches for r in self.rounds)
        seconds = sum(r.seconds for r in self.rounds)
        rates = [r.images_per_second for r in self.rounds]
        # The median round, not the sum: one round slowed by a cold start or a neighbour does not move it.
        median = sorted(self.rounds, key=lambda r: r.images_per_second)[(len(self.rounds) - 1) // 2]
        return {"backend": self.loader.backend, "device": str(self.loader.device), "parallelism": parallelism(info),
                "images_per_second": median.images_per_second,
                "batches_per_second": median.batches / median.seconds if median.seconds else float("nan"),
                "stall_fraction": median.stall_fraction,
                "round_images_per_second": rates, "prefetch_depth": self.loader.prefetch_depth,
                # what ran, not what was asked: --warmup is raised to the prefetch depth, --batches 0 is a floor
                "warmup": self.rounds[0].drained, "min_batches": self.rounds[0].min_batches,
                "time_to_first_batch_s": self.first_batch_s, "build_s": self.build_s,
                "peak_memory_bytes": self.peak_memory, "peak_gpu_bytes": peak_gpu_bytes(self.loader.device),
                "images": images, "batches": batches, "seconds": seconds,
                "batch_shape": self.shapes.first, "batch_shapes": [list(shape) for shape in self.shapes.seen],
                "dtype": self.shapes.dtype,
                "rounds": [r.as_dict() for r in self.rounds], "cpu_decoded": self.stream.all_cpu_decoded(),
                "per_batch": {"wait_s": list(self.timeline.wait_s), "done_s": list(self.timeline.done_s)},
                "config": config_to_dict(self.loader.config)}


def cpu_decoded_line(cpu_decoded: dict[str, int]) -> str:
    """The DALI GPU flavour's images its decoders left to DALI's CPU decoder over the run, by reason
    (dali_loader.stack.cpu_decode_reason): 0 where nvJPEG decoded every one."""
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(cpu_decoded.items()))
    return (f"dali: {sum(cpu_decoded.values())} images decoded on the CPU, not with nvJPEG, over the run "
            f"(loader.stats.cpu_decoded){f' ({reasons})' if reasons else ''}")


def report(runs: list[Run], args) -> None:
    results = [r.result() for r in runs]
    first = runs[0].loader
    print(f"split {args.split}: {plural(first.num_samples, 'sample')}, {len(first)} "
          f"{'batch' if len(first) == 1 else 'batches'}/epoch of {first.batch_size}, "
          f"{shapes_words(results[0]['batch_shapes'])} {results[0]['dtype']}, classes: {', '.join(first.classes[:8])}"
          f"{' ...' if len(first.classes) > 8 else ''}")
    print(f"{plural(args.rounds, 'round')} per backend, each timing at least {args.seconds:g} s and "
          f"{plural(args.batches, 'batch') if args.batches else '10 x prefetch depth batches'} after draining the "
          f"prefetched ones; "
          f"model step {args.step_ms:g} ms; the table gives the median round")
    header = ("backend", "device", "parallelism", "images/s", "rounds", "batches/s", "stall", "build + first batch",
              "peak memory")
    rows = [(r["backend"], r["device"], r["parallelism"], f"{r['images_per_second']:.0f}", _spread(r),
             f"{r['batches_per_second']:.1f}", f"{r['stall_fraction']:.1%}",
             f"{r['build_s']:.2f} + {r['time_to_first_batch_s']:.2f} s", human_bytes(r["peak_memory_bytes"]))
            for r in results]
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(str(cell).ljust(width) if i < 3 else str(cell).rjust(width)
                        for i, (cell, width) in enumerate(zip(row, widths))))
    for result in results:
        if result["backend"] == "dali" and result["device"].startswith("cuda"):
            print(cpu_decoded_line(result["cpu_decoded"]))
        fewest = min(r["batches"] for r in result["rounds"])
        if result["prefetch_depth"] > SHARE_NOTE * fewest:
            print(f"note: the {result['backend']} loader holds up to {result['prefetch_depth']} batches prepared "
                  f"ahead, {result['prefetch_depth'] / fewest:.0%} of the {fewest} batches its shortest round timed, "
                  f"so its rate is uncertain by up to that share; raise --seconds or --batches")
    summary = {"split": args.split, "config_file": str(args.config), "rounds": args.rounds, "seconds": args.seconds,
               "batches_asked": args.batches, "warmup_asked": args.warmup, "step_ms": args.step_ms,
               "hardware": hardware(),
               "runs": results}
    if len(results) == 2:
        ratio = results[1]["images_per_second"] / results[0]["images_per_second"]
        summary["ratio"] = {f"{results[1]['backend']}/{results[0]['backend']}": ratio}
        print(f"{results[1]['backend']} / {results[0]['backend']}: {ratio:.2f}x images/s")
    else:
        summary.update({k: v for k, v in results[0].items() if k not in ("per_batch", "rounds")})
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(_finite(summary), handle, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args, args.plot)
        print(f"wrote {args.plot}")


def shapes_words(shapes: list[list[int]]) -> str:
    """'batches [32, 3, 128, 128]', or where batches differ (transform.sizes, batch_sizes, a short last
    batch) each shape the run met: 'batches of 3 shapes: [16, 3, 96, 96], [12, 3, 128, 128], ...'."""
    if len(shapes) == 1:
        return f"batches {shapes[0]}"
    ordered = sorted(shapes, key=lambda shape: (shape[2:], shape[0]))
    listed = ", ".join(str(shape) for shape in ordered[:6])
    return f"batches of {len(shapes)} shapes: {listed}{', ...' if len(shapes) > 6 else ''}"


def _spread(result: dict) -> str:
    """The rounds' lowest and highest images/s: how stable the figure is."""
    rates = result["round_images_per_second"]
    return f"{min(rates):.0f}-{max(rates):.0f}" if len(rates) > 1 else "1 round"


def _finite(value):
    """NaN (a run too short to measure) as null: JSON has no NaN."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def plot(results: list[dict], args, path: str) -> None:
    """Throughput over time (images/s over a sliding window of batches) and the wait per batch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), dpi=100, sharex=False)
    for result in results:
        done = result["per_batch"]["done_s"]
        batch = result["images"] / max(1, result["batches"])
        window = max(1, min(10, len(done) // 5))
        times = [done[i] for i in range(window, len(done))]
        rates = [window * batch / (done[i] - done[i - window]) for i in range(window, len(done))]
        label = f"{result['backend']} ({result['images_per_second']:.0f} images/s)"
        top.plot(times, rates, label=label)
        bottom.plot(range(1, len(done) + 1), [1000 * w for w in result["per_batch"]["wait_s"]], ".",
                    markersize=3, label=f"{result['backend']} (stall {result['stall_fraction']:.0%})")
    top.set(xlabel="seconds timed", ylabel="images/s", title=f"fastloader bench {os.path.basename(str(args.config))}, "
            f"split {args.split}, model step {args.step_ms:g} ms")
    bottom.set(xlabel="timed batch", ylabel="wait for the batch (ms)")
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
        axes.legend(loc="best", fontsize=8)
    top.set_ylim(bottom=0)
    bottom.set_ylim(bottom=0)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def simulated_step(device, ms: float):
    """A stand-in for the model: busy for `ms` on the loader's device (cuda:N, not whichever GPU is
    current: torch.cuda._sleep runs on the current device), the host waiting as for `loss.item()`."""
    if ms <= 0:
        return lambda images: None
    import torch
    if device.type == "cuda":
        cycles = _cuda_cycles_per_ms(device) * ms

        def step(images):
            with torch.cuda.device(device):
                torch.cuda._sleep(int(cycles))
            torch.cuda.current_stream(device).synchronize()
        return step

    def spin(images):  # a CPU model keeps a core busy; sleeping would leave it to the workers
        end = time.perf_counter() + ms / 1000
        while time.perf_counter() < end:
            pass
    return spin


def _cuda_cycles_per_ms(device) -> float:
    import torch
    with torch.cuda.device(device):
        torch.cuda._sleep(1_000_000)  # warm up
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        torch.cuda._sleep(10_000_000)
        torch.cuda.synchronize(device)
    return 10_000_000 / ((time.perf_counter() - started) * 1000)


def synchronize(device) -> None:
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


def peak_gpu_bytes(device) -> int | None:
    if device.type != "cuda":
        return None
    import torch
    return torch.cuda.max_memory_allocated(device)


def parallelism(info: dict) -> str:
    """How the loader decodes in parallel: torch workers, or DALI's flavour and threads."""
    if "flavour" in info:
        feed = f", feed {info['feed_processes']} processes" if info.get("feed_processes") else ""
        return f"dali {info['flavour']}, {info['threads']} threads{feed}"
    return plural(info["workers"], "worker")
