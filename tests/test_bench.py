"""`fastloader bench` as a user runs it: both backends interleaved, a simulated model step, JSON and PNG."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from test_cli import run

SMALL = ["--set", "train.transform.size=32", "--set", "train.batch_size=16"]


def test_both_backends_interleaved_with_json_and_plot(tmp_path):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    out = tmp_path / "out"
    result = run("bench", "configs/sample.yaml", "--backend", "both", "--batches", "6", "--warmup", "1",
                 "--json", str(out / "bench.json"), "--plot", str(out / "bench.png"), *SMALL, cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "6 batches timed per backend after 1 warm-up batches per round; model step 0 ms" in result.stdout
    summary = json.loads((out / "bench.json").read_text())
    torch_run, dali_run = summary["runs"]
    assert (torch_run["backend"], dali_run["backend"]) == ("torch", "dali")
    for run_ in summary["runs"]:
        assert run_["images"] == 6 * 16 and run_["batches"] == 6 and len(run_["per_batch"]["wait_s"]) == 6
        assert run_["images_per_second"] == pytest.approx(run_["images"] / run_["seconds"])
        assert 0 < run_["stall_fraction"] <= 1 and run_["time_to_first_batch_s"] > 0
        assert run_["peak_memory_bytes"] > 100 * 2**20 and run_["batch_shape"] == [16, 3, 32, 32]
        assert run_["config"]["train"]["batch_size"] == 16 and run_["config"]["backend"] == run_["backend"]
    ratio = dali_run["images_per_second"] / torch_run["images_per_second"]
    assert summary["ratio"] == {"dali/torch": pytest.approx(ratio)}
    assert f"dali / torch: {ratio:.2f}x images/s" in result.stdout
    assert "3 rounds" not in result.stdout and "18/18 batches" in result.stderr  # 2 x 3 rounds x (1 + 2)
    image = np.asarray(Image.open(out / "bench.png").convert("RGB"))
    assert image.shape == (500, 700, 3)
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20  # axes, two coloured series, text: not blank


def test_a_model_step_that_hides_the_loading_shows_as_a_smaller_stall(tmp_path):
    results = {}
    for step in ("0", "40"):
        path = tmp_path / f"step{step}.json"
        result = run("bench", "configs/sample.yaml", "--backend", "torch", "--batches", "8", "--step-ms", step,
                     "--json", str(path), *SMALL, cache_dir=tmp_path)
        assert result.returncode == 0, result.stderr
        results[step] = json.loads(path.read_text())
    assert results["0"]["backend"] == "torch" and results["0"]["step_ms"] == 0
    assert results["0"]["stall_fraction"] > 0.5  # nothing to do but wait for data
    assert results["40"]["stall_fraction"] < results["0"]["stall_fraction"] / 2
    assert results["40"]["seconds"] >= 8 * 0.040  # the step really ran
