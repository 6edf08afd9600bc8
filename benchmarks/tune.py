"""`fastloader tune` against the config's hand settings and against the best of a full grid, on the
real photos, all measured in the same run.

The config: the torch backend with `num_workers: 0` (the hand settings), rand-m9 at 128 px, batch 32,
the real photos' train split. The run:
1. tunes it (fastloader.commands.tuning.tune, as `fastloader tune` does), timed;
2. measures, in interleaved rounds (the order reversed each round, so that machine noise hits all
   alike), each setting of the grid (torch workers 0-4, DALI threads 1-4 where DALI runs), the hand
   settings and the tuned ones, each round a fresh loader with its prefetched batches drained untimed;
3. checks that the tuned loader yields the same labels in the same order as the hand settings.

    python benchmarks/tune.py                      # all the cores this process may use
    taskset -c 0 python benchmarks/tune.py         # one core
    python benchmarks/tune.py --rounds 3 --seconds 3 --json tune.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import harness

from fastloader import build_loader, load_config
from fastloader.commands.tuning import Setting, Tuner, budget_for, report_lines, tune
from fastloader.machine import hardware, usable_cores


def hand_config(data, device: str) -> dict:
    return {"dataset": {"root": str(data)}, "backend": "torch", "workers": {"num_workers": 0},
            "output": {"device": device}, "stats": {"log_level": "none"},
            "train": {"batch_size": 32, "transform": {"size": 128, "auto_augment": "rand-m9"}}}


def grid(dali: bool, gpu: bool) -> list[Setting]:
    """torch workers 0-4, DALI threads 1-4 (feed processes as DALI's auto gives them), prefetch 2."""
    points = [Setting("torch", (("workers.num_workers", w), ("workers.pin_memory", "auto"),
                                ("workers.prefetch_factor", 2))) for w in range(5)]
    if dali:
        points += [Setting("dali", tuple(sorted({"dali.threads": t, "dali.feed_processes": "auto",
                                                 "workers.prefetch_factor": 2,
                                                 **({"dali.hw_decoder_load": 0.65} if gpu else {})}.items())))
                   for t in range(1, 5)]
    return points


def grid_of(points: list[Setting], tuned: Setting) -> list[Setting]:
    """The points that are not the tuned setting itself."""
    return [s for s in points if s != tuned]


def same_labels(config: dict, tuned: Setting, epochs: int = 1) -> bool:
    """The tuned loader's labels, epoch by epoch, against the hand settings'."""
    with build_loader(config, "train") as hand, build_loader(config, "train", tuned.overrides()) as faster:
        for epoch in range(epochs):
            hand.set_epoch(epoch)
            faster.set_epoch(epoch)
            if [labels.tolist() for _, labels in hand] != [labels.tolist() for _, labels in faster]:
                return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    parser.add_argument("--seconds", type=float, default=2.0, help="each round of each setting (default: 2)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the comparison (default: 2)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    data = harness.check_data(parser, args.data, ["train"])
    import torch
    gpu = torch.cuda.is_available()
    config = hand_config(data, "cuda" if gpu else "cpu")
    print(f"{usable_cores()} core(s) usable; {hardware()['cpu']}; GPU: {hardware().get('gpu', 'none')}")

    started = time.perf_counter()
    result = tune(config, "train", say=lambda line: None)  # as `fastloader tune` runs, its defaults
    tune_s = time.perf_counter() - started
    print(f"tune took {tune_s:.0f} s")
    for line in report_lines(result):
        print(line)

    tuner = Tuner(load_config(config), "train", args.seconds, budget_for(1), say=lambda line: None)
    hand, tuned = result.given.setting, result.chosen.setting
    # the tuned setting is measured as the grid point that builds the same loader, where one does (DALI's
    # feed_processes auto is 0 on the CPU); the hand settings last: a slow in-process loader's last batch
    # still decodes for a moment after it is closed, which costs the setting measured next
    points = grid(tuner.dali_runs, gpu)
    for setting in (tuned, hand):
        if setting not in points:
            points.append(setting)
    points.remove(hand)
    points.append(hand)
    for number in range(args.rounds):
        for setting in points if number % 2 == 0 else points[::-1]:
            tuner.measure(setting, again=True)
        twin = next((s for s in grid_of(points, tuned) if tuner.trials[s].label == tuner.trials[tuned].label), None)
        if twin is not None:  # the same loader as a grid point: measured as that point from now on
            points.remove(tuned)
            tuned = twin
    labels = {s: tuner.trials[s].label for s in points}
    rates = {s: statistics.median(tuner.trials[s].rates) for s in points}
    grid_points = [s for s in grid(tuner.dali_runs, gpu) if s in rates]
    best = max(grid_points, key=rates.get)
    print(f"\n{args.rounds} interleaved rounds of {args.seconds:g} s per setting, medians:")
    for setting in sorted(points, key=lambda s: -rates[s]):
        marks = [m for m, s in (("tuned", tuned), ("hand", hand), ("best of grid", best)) if s == setting]
        print(f"  {labels[setting]:<52} {rates[setting]:7.0f} images/s  {', '.join(marks)}")
    same = same_labels(config, tuned)
    summary = {"hardware": hardware(), "cores": usable_cores(), "tune_s": tune_s, "seconds": args.seconds,
               "rounds": args.rounds, "tuned": labels[tuned], "hand": labels[hand], "best_of_grid": labels[best],
               "rates": {labels[s]: rates[s] for s in points},
               "tuned_over_best": rates[tuned] / rates[best], "tuned_over_hand": rates[tuned] / rates[hand],
               "same_labels_in_order": same}
    print(f"tuned / best of grid: {summary['tuned_over_best']:.2f}x; tuned / hand: {summary['tuned_over_hand']:.2f}x; "
          f"tune: {tune_s:.0f} s; the tuned loader yields the same labels in the same order: {same}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1)
        print(f"wrote {args.json}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
