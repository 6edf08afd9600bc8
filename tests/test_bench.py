"""`fastloader bench` as a user runs it: both backends interleaved, a simulated model step, JSON and PNG,
and rounds that cannot time batches the loader prepared before they began."""
from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from PIL import Image
from test_cli import run

from fastloader import build_loader

SMALL = ["--set", "train.transform.size=32", "--set", "train.batch_size=16"]
EXACT = ["--seconds", "0", "--rounds", "3"]  # exactly --batches per round, no time floor


def test_both_backends_interleaved_with_json_and_plot(tmp_path):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    out = tmp_path / "out"
    result = run("bench", "configs/sample.yaml", "--backend", "both", "--batches", "6", "--warmup", "1", *EXACT,
                 "--json", str(out / "bench.json"), "--plot", str(out / "bench.png"), *SMALL, cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ("3 rounds per backend, each timing at least 0 s and 6 batches after draining the prefetched ones; "
            "model step 0 ms") in result.stdout
    # where the backend came from: the command, not the config file
    assert "backend torch for split 'train': backend: torch (from the command's --backend both)" in result.stderr
    assert "backend: dali (from the command's --backend both)" in result.stderr
    summary = json.loads((out / "bench.json").read_text())
    torch_run, dali_run = summary["runs"]
    assert (torch_run["backend"], dali_run["backend"]) == ("torch", "dali")
    # sample.yaml: 2 workers x prefetch 2 and the producer's one; DALI: its queue of 2, the batch assembled, the
    # one its driver holds
    assert torch_run["prefetch_depth"] == 2 * 2 + 1 and dali_run["prefetch_depth"] == 2 + 2
    for run_ in summary["runs"]:
        assert [r["batches"] for r in run_["rounds"]] == [6, 6, 6] and run_["images"] == 3 * 6 * 16
        assert [r["drained"] for r in run_["rounds"]] == [run_["prefetch_depth"]] * 3  # > --warmup 1
        assert run_["warmup"] == run_["prefetch_depth"] and run_["min_batches"] == 6  # what ran
        rates = sorted(r["images_per_second"] for r in run_["rounds"])
        assert run_["images_per_second"] == pytest.approx(rates[1])  # the median round
        assert run_["round_images_per_second"] == [r["images_per_second"] for r in run_["rounds"]]
        assert 0 < run_["stall_fraction"] <= 1 and run_["time_to_first_batch_s"] > 0
        assert run_["peak_memory_bytes"] > 100 * 2**20 and run_["batch_shape"] == [16, 3, 32, 32]
        assert run_["config"]["train"]["batch_size"] == 16 and run_["config"]["backend"] == run_["backend"]
        # each round's line and the table say the same: the table's figure is one of the rounds' lines
        lines = re.findall(rf"round \d/3 {run_['backend']}: 96 images in 6 batches \(0\.4 epochs\), [\d.]+ s: "
                           rf"(\d+) images/s", result.stdout)
        assert len(lines) == 3 and f"{run_['images_per_second']:.0f}" in lines
    assert "epoch 0, rank 0" not in result.stderr  # the loaders' per-epoch lines, cut by rounds, are off
    ratio = dali_run["images_per_second"] / torch_run["images_per_second"]
    assert summary["ratio"] == {"dali/torch": pytest.approx(ratio)}
    assert (summary["warmup_asked"], summary["batches_asked"]) == (1, 6) and "warmup" not in summary
    assert f"dali / torch: {ratio:.2f}x images/s" in result.stdout
    assert "6/6 rounds" in result.stderr
    assert "note: the torch loader holds up to 5 batches prepared ahead, 83% of the 6 batches" in result.stdout
    image = np.asarray(Image.open(out / "bench.png").convert("RGB"))
    assert image.shape == (500, 700, 3)
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20  # axes, two coloured series, text: not blank


def test_a_model_step_that_hides_the_loading_shows_as_a_smaller_stall(tmp_path):
    results = {}
    for step in ("0", "40"):
        path = tmp_path / f"step{step}.json"
        result = run("bench", "configs/sample.yaml", "--backend", "torch", "--batches", "8", "--rounds", "1",
                     "--seconds", "0", "--step-ms", step, "--json", str(path), *SMALL, cache_dir=tmp_path)
        assert result.returncode == 0, result.stderr
        results[step] = json.loads(path.read_text())
    assert results["0"]["backend"] == "torch" and results["0"]["step_ms"] == 0
    # what ran: 5 batches drained (2 workers x prefetch 2 + the producer's, above --warmup's default 2), a floor
    # of 8 timed batches
    assert (results["0"]["warmup"], results["0"]["warmup_asked"]) == (5, 2)
    assert (results["0"]["min_batches"], results["0"]["batches_asked"], results["0"]["batches"]) == (8, 8, 8)
    assert results["0"]["stall_fraction"] > 0.5  # nothing to do but wait for data
    assert results["40"]["stall_fraction"] < results["0"]["stall_fraction"] / 2
    assert results["40"]["seconds"] >= 8 * 0.040  # the step really ran


def test_the_time_floor_spans_epochs(tmp_path):
    path = tmp_path / "floor.json"
    result = run("bench", "configs/sample.yaml", "--backend", "torch", "--rounds", "1", "--seconds", "1.5",
                 "--json", str(path), *SMALL, cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    timed = json.loads(path.read_text())["runs"][0]["rounds"][0]
    assert timed["seconds"] >= 1.5 and timed["batches"] >= 50  # default floor: 10 x (2 workers x prefetch 2 + 1)
    assert timed["batches"] > 15 * 2  # 15 batches per epoch of 240 at 16: more than two epochs


def _write_slow_dataset(root):
    """Noise PNGs: slow to decode and not shrinkable while decoding, so that one worker is the limit and
    a batch costs far more to make than to hand over."""
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        folder = root / "val" / name
        folder.mkdir(parents=True)
        for i in range(12):
            Image.fromarray(rng.integers(0, 256, (640, 640, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def test_a_round_cannot_time_batches_prepared_before_it(tmp_path):
    """One slow worker with a deep prefetch queue that fills while the other backend has its turn. Timing
    those ready batches (what the old bench did after its 2 warm-up batches) gives a rate the worker cannot
    sustain; the bench drains them first, so its rounds time batches made while they ran."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    root = _write_slow_dataset(tmp_path / "slow")
    config = {"dataset": {"root": str(root)}, "backend": "torch", "output": {"device": "cpu"},
              "workers": {"num_workers": 1, "prefetch_factor": 8}, "dali": {"threads": 1},
              "val": {"batch_size": 6, "transform": {"size": 32}}}
    with build_loader(config, "val") as deep:  # the trap, shown by hand
        stream = (batch for _ in range(3) for batch in deep)  # epochs of 4 batches, one after another
        next(stream)
        time.sleep(3.0)  # the worker fills its 8 slots, as it does while the other backend runs
        started = time.perf_counter()  # the rest of the epoch, all prepared: the next epoch's first batch
        images = sum(len(next(stream)[1]) for _ in range(3))  # may still be decoding, as it was under load
        trap = images / (time.perf_counter() - started)
    config_path = tmp_path / "slow.yaml"
    config_path.write_text(json.dumps(config))
    path = tmp_path / "slow.json"
    result = run("bench", str(config_path), "--split", "val", "--backend", "both", "--batches", "4",
                 "--seconds", "0", "--rounds", "2", "--json", str(path), cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    torch_run = json.loads(path.read_text())["runs"][0]
    assert torch_run["prefetch_depth"] == 9 and [r["drained"] for r in torch_run["rounds"]] == [9, 9]
    fastest = max(r["images_per_second"] for r in torch_run["rounds"])
    assert fastest * 4 < trap, (torch_run["rounds"], trap)  # the old bench printed about `trap`
    assert "note: the torch loader holds up to 9 batches prepared ahead, 225% of the 4 batches" in result.stdout


def test_both_backends_refuse_a_backend_forced_by_the_environment(tmp_path):
    result = run("bench", "configs/sample.yaml", "--backend", "both", cache_dir=tmp_path, FASTLOADER_BACKEND="torch")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("--backend both compares the two backends, but FASTLOADER_BACKEND=torch forces every loader onto one; "
            "unset FASTLOADER_BACKEND (or use --backend torch)") in result.stderr


def test_the_summary_gives_the_build_beside_the_first_batch_one_worker_and_each_batch_shape(tmp_path):
    """Torch backend, CPU. A trainer waits for build_loader and then for the first batch: the torch
    workers start in the build, so the first batch alone read 0.00 s where a fresh process waited
    0.5-0.8 s. With transform.sizes each batch has one of several shapes, not the first one's."""
    path = tmp_path / "sizes.json"
    result = run("bench", "configs/sample.yaml", "--backend", "torch", "--rounds", "1", "--seconds", "0",
                 "--batches", "4", "--json", str(path), *SMALL, "--set", "workers.num_workers=1",
                 "--set", "train.transform.sizes=[32,48]", cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(path.read_text())
    assert summary["batch_shapes"] in ([[16, 3, 32, 32], [16, 3, 48, 48]], [[16, 3, 48, 48], [16, 3, 32, 32]])
    assert ("split train: 240 samples, 15 batches/epoch of 16, batches of 2 shapes: [16, 3, 32, 32], "
            "[16, 3, 48, 48] float32") in result.stdout
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("backend "))
    row = lines[lines.index(header) + 1]
    assert "  build + first batch  " in header
    assert re.match(r"torch +cpu +1 worker +\d+ +1 round ", row), row
    build, first = re.search(r" (\d+\.\d\d) \+ (\d+\.\d\d) s ", row).groups()
    assert (build, first) == (f"{summary['build_s']:.2f}", f"{summary['time_to_first_batch_s']:.2f}")
    assert summary["build_s"] > 0.01 and summary["time_to_first_batch_s"] > 0


def test_the_parallelism_column_names_the_dali_feeds_worker_processes():
    from fastloader.commands.bench import parallelism
    assert parallelism({"flavour": "gpu", "threads": 8, "feed_processes": 4}) == "dali gpu, 8 threads, feed 4 processes"
    assert parallelism({"flavour": "cpu", "threads": 2, "feed_processes": 0}) == "dali cpu, 2 threads"
    assert parallelism({"workers": 3}) == "3 workers" and parallelism({"workers": 1}) == "1 worker"


def test_the_bench_counts_what_the_dali_gpu_flavours_decoders_leave_to_the_cpu_over_every_loop(tmp_path):
    """Device: CPU (the CPU flavour's feed told it feeds GPU decoders, as test_gpu_flavour.py does).
    cpu_decoded over a bench run: every finished loop's and the one under way, by reason; the line the
    report prints for the GPU flavour."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    from conftest import base_config

    from dali_loader.stack import GpuDecoding
    from fastloader.commands.bench import Run, cpu_decoded_line

    root = tmp_path / "mixed"
    for c in ("a", "b"):
        (root / "train" / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (48, 40), (40 * i, 90, 20)).save(root / "train" / c / f"j{i}.jpg", subsampling=2)
    Image.new("RGB", (48, 40), (1, 2, 3)).save(root / "train" / "a" / "p.png")
    Image.new("RGB", (48, 40), (1, 2, 3)).save(root / "train" / "b" / "p.png")
    config = base_config(root, backend="dali", train={"batch_size": 4, "transform": {"size": 32}})
    with build_loader(config, "train") as loader:  # 8 images, 2 batches an epoch
        loader._reader.gpu = GpuDecoding(True, True, (13, 0, 1))
        bench_run = Run(loader, 0.0, 0.0)
        bench_run.round(warmup=0, min_batches=5, min_seconds=0)  # drained first, then 5: 2 loops done, 1 under way
        counted = bench_run.result()["cpu_decoded"]
    batches = bench_run.rounds[0].drained + bench_run.rounds[0].batches
    loops_done, under_way = divmod(batches, 2)
    assert under_way == 1 and loops_done >= 2
    # every image goes to the CPU here (a PNG, or a 4:2:0 region with interpolated chroma below nvJPEG 13.2):
    # 2 PNG files and 6 regions a whole loop, and the batch the loop under way has delivered
    regions = counted["regions of 4:2:0 JPEGs with interpolated chroma"]
    assert sum(counted.values()) == 4 * batches and 2 * loops_done <= counted["PNG files"] <= 2 * loops_done + 2
    line = cpu_decoded_line(counted)
    assert line.startswith(f"dali: {4 * batches} images decoded on the CPU, not with nvJPEG, over the run")
    assert f"regions of 4:2:0 JPEGs with interpolated chroma: {regions}" in line
    assert cpu_decoded_line({}) == "dali: 0 images decoded on the CPU, not with nvJPEG, over the run " \
                                   "(loader.stats.cpu_decoded)"
