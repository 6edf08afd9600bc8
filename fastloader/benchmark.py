"""`fastloader bench`: iterate a split as a trainer would and report what the trainer waited.

A simulated model step (--step-ms, busy on the output device) stands in for the model, so a loader
that keeps up shows a stall near 0% and one that does not shows how far it falls behind. With
`--backend both`, the two backends run in alternating rounds in one process, so that both see the
same machine state (page cache, clocks, neighbours), and their ratio is printed.
"""
from __future__ import annotations

import json
import os
import sys
import time
from array import array

from .progress import Progress

HELP = "iterate a split and report images/s, stall, time to first batch and memory"
EXAMPLES = """  fastloader bench configs/sample.yaml
  fastloader bench configs/sample.yaml --backend both --step-ms 20 --json bench.json --plot bench.png
  fastloader bench configs/imagenette.yaml --split val --set dataset.root=/data/imagenette2-320 --batches 50
"""


def add_arguments(parser) -> None:
    parser.add_argument("--split", default="train", help="split section to read (default: train)")
    parser.add_argument("--backend", choices=("auto", "torch", "dali", "both"),
                        help="override the config's backend; both: torch and dali in alternating rounds")
    parser.add_argument("--batches", type=int, default=0,
                        help="batches to time per backend (default: one epoch); epochs repeat as needed")
    parser.add_argument("--warmup", type=int, default=2,
                        help="batches run untimed before each round (default: 2)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="timed rounds per backend (default: 3 with --backend both, else 1)")
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="a simulated model step of this many ms, busy on the output device, after each batch")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of throughput over time and stall per batch")


def run(args) -> int:
    from . import build_loader
    backends = ["torch", "dali"] if args.backend == "both" else [args.backend]
    rounds = args.rounds or (3 if args.backend == "both" else 1)
    for name, value in (("--batches", args.batches), ("--warmup", args.warmup), ("--rounds", rounds)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    for path in (args.json, args.plot):  # fail before a long run, not after it
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    runs = []
    try:
        for backend in backends:
            overrides = list(args.overrides) + ([f"backend={backend}"] if backend else [])
            started = time.perf_counter()
            loader = build_loader(args.config, split=args.split, overrides=overrides)
            runs.append(Run(loader, time.perf_counter() - started, args.step_ms))
        per_epoch = len(runs[0].loader)
        if per_epoch == 0:
            print(f"fastloader: error: split '{args.split}' yields no batch per epoch (see the warning above)",
                  file=sys.stderr)
            return 1
        total = args.batches or per_epoch
        per_round = [total // rounds + (1 if r < total % rounds else 0) for r in range(rounds)]
        progress = Progress(len(runs) * (rounds * args.warmup + total))
        for count in per_round:
            for bench_run in runs:  # alternate, so that neither backend gets a quieter machine
                bench_run.round(args.warmup, count, progress)
        progress.finish()
        report(runs, args, total)
    finally:
        for bench_run in runs:
            bench_run.loader.close()
    return 0


class Run:
    """One loader under measurement. Its rounds continue one stream of batches (epochs repeat as
    needed); each round first takes `warmup` batches untimed, which also drains what the loader
    prefetched while the other backend had its turn."""

    def __init__(self, loader, build_s: float, step_ms: float):
        self.loader, self.build_s = loader, build_s
        self.step = simulated_step(loader.device, step_ms)
        self.stream = self._batches()
        self.first_batch_s = float("nan")
        self.shape = self.dtype = None
        self.images = 0
        self.seconds = 0.0  # timed wall time, rounds summed
        self.wait_s = 0.0
        self.batch_wait_s, self.batch_done_s = array("d"), array("d")  # timed batches, for the plot
        self.peak_memory = 0  # bytes, the largest of the samples taken after each round

    def _batches(self):
        while True:
            for batch in self.loader:
                yield batch

    def round(self, warmup: int, count: int, progress: Progress) -> None:
        clock = time.perf_counter
        for _ in range(warmup):
            self._next(clock)
            progress.advance()
        started = clock()
        for _ in range(count):
            asked = clock()
            images = self._next(clock)
            arrived = clock()
            self.step(images)
            self.images += len(images)
            self.wait_s += arrived - asked
            self.batch_wait_s.append(arrived - asked)
            self.batch_done_s.append(self.seconds + clock() - started)
            progress.advance()
        synchronize(self.loader.device)
        self.seconds += clock() - started
        # Reading PSS takes ~10 ms per process, so it is sampled after each round, off the clock.
        self.peak_memory = max(self.peak_memory, process_tree_memory())

    def _next(self, clock):
        asked = clock()
        images, _ = next(self.stream)
        if self.shape is None:
            self.first_batch_s = clock() - asked
            self.shape, self.dtype = list(images.shape), str(images.dtype).removeprefix("torch.")
        return images

    def result(self) -> dict:
        from .config import config_to_dict
        info = self.loader.describe()
        batches = len(self.batch_wait_s)
        return {"backend": self.loader.backend, "device": str(self.loader.device), "parallelism": parallelism(info),
                "images_per_second": self.images / self.seconds if self.seconds else float("nan"),
                "batches_per_second": batches / self.seconds if self.seconds else float("nan"),
                "stall_fraction": self.wait_s / self.seconds if self.seconds else float("nan"),
                "time_to_first_batch_s": self.first_batch_s, "build_s": self.build_s,
                "peak_memory_bytes": self.peak_memory, "peak_gpu_bytes": peak_gpu_bytes(self.loader.device),
                "images": self.images, "batches": batches, "seconds": self.seconds,
                "batch_shape": self.shape, "dtype": self.dtype,
                "per_batch": {"wait_s": list(self.batch_wait_s), "done_s": list(self.batch_done_s)},
                "config": config_to_dict(self.loader.config)}


def report(runs: list[Run], args, total: int) -> None:
    results = [r.result() for r in runs]
    first = runs[0].loader
    print(f"split {args.split}: {first.num_samples} samples, {len(first)} batches/epoch of {first.batch_size}, "
          f"batches {results[0]['batch_shape']} {results[0]['dtype']}, classes: {', '.join(first.classes[:8])}"
          f"{' ...' if len(first.classes) > 8 else ''}")
    print(f"{total} batches timed per backend after {args.warmup} warm-up batches per round; "
          f"model step {args.step_ms:g} ms")
    header = ("backend", "device", "parallelism", "images/s", "batches/s", "stall", "first batch", "peak memory")
    rows = [(r["backend"], r["device"], r["parallelism"], f"{r['images_per_second']:.0f}",
             f"{r['batches_per_second']:.1f}", f"{r['stall_fraction']:.1%}", f"{r['time_to_first_batch_s']:.2f} s",
             human_bytes(r["peak_memory_bytes"])) for r in results]
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(str(cell).ljust(width) if i < 3 else str(cell).rjust(width)
                        for i, (cell, width) in enumerate(zip(row, widths))))
    summary = {"split": args.split, "config_file": str(args.config), "batches": total, "warmup": args.warmup,
               "step_ms": args.step_ms, "hardware": hardware(), "runs": results}
    if len(results) == 2:
        ratio = results[1]["images_per_second"] / results[0]["images_per_second"]
        summary["ratio"] = {f"{results[1]['backend']}/{results[0]['backend']}": ratio}
        print(f"{results[1]['backend']} / {results[0]['backend']}: {ratio:.2f}x images/s")
    else:
        summary.update({k: v for k, v in results[0].items() if k != "per_batch"})
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(_finite(summary), handle, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args, args.plot)
        print(f"wrote {args.plot}")


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
    """A stand-in for the model: busy for `ms` on the device, the host waiting as for `loss.item()`."""
    if ms <= 0:
        return lambda images: None
    import torch
    if device.type == "cuda":
        cycles = _cuda_cycles_per_ms(device) * ms

        def step(images):
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


def process_tree_memory() -> int:
    """Memory of this process and its descendants (DataLoader workers), from /proc: proportional set
    size, so pages a forked worker shares with its parent count once, not once per process."""
    total, pending = 0, [os.getpid()]
    while pending:
        pid = pending.pop()
        try:
            total += _proc_kib(f"/proc/{pid}/smaps_rollup", "Pss:") * 1024
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    pending += [int(child) for child in children.read().split()]
        except (OSError, StopIteration, ValueError):  # gone meanwhile, or not Linux
            continue
    return total


def _proc_kib(path: str, key: str) -> int:
    with open(path) as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith(key))


def peak_gpu_bytes(device) -> int | None:
    if device.type != "cuda":
        return None
    import torch
    return torch.cuda.max_memory_allocated(device)


def human_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def hardware() -> dict:
    import platform

    import torch
    info = {"cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(), "torch": torch.__version__}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def parallelism(info: dict) -> str:
    """How the loader decodes in parallel: torch workers, or DALI's flavour and threads."""
    if "flavour" in info:
        return f"dali {info['flavour']}, {info['threads']} threads"
    return f"{info['workers']} workers"
