"""benchmarks/train_step.py in its tiny CPU mode: every kind of peer trains, and the table, the
ratios to the model alone and the JSON report come out."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, write_textured_dataset


def test_train_step_benchmark_runs_each_kind_of_peer_on_the_cpu(tmp_path):
    pytest.importorskip("nvidia.dali", reason="the DALI and NVIDIA peers need NVIDIA DALI")
    data = write_textured_dataset(tmp_path / "data", per_class=4)
    report = tmp_path / "report.json"
    command = [sys.executable, str(REPO / "benchmarks" / "train_step.py"), "--device", "cpu", "--models", "resnet18",
               "--peers", "model,torch,dali-cache,nvidia", "--batch-size", "4", "--size", "32", "--short-side", "36",
               "--warmup", "1", "--batches", "1", "--rounds", "1", "--workers", "1", "--data", str(data),
               "--json", str(report)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(report.read_text())["splits"]["train"]["summary"]
    peers = ["model only", "fastloader torch JPEG", "fastloader dali cached", "NVIDIA RN50 example"]
    assert all(summary[f"resnet18: {peer}"]["median"] > 0 for peer in peers), summary
    ratios = summary["ratios"]
    assert sorted(ratios) == sorted(f"resnet18: {peer} / resnet18: model only" for peer in peers[1:])
    assert "ratio resnet18: fastloader dali cached / resnet18: model only" in run.stdout
    assert "cache of 12 images built" in run.stdout


def test_train_step_benchmark_names_what_it_does_not_know(tmp_path):
    command = [sys.executable, str(REPO / "benchmarks" / "train_step.py"), "--device", "cpu", "--peers", "model,tpu"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2 and "unknown peer or model: tpu" in run.stderr and "peers are model" in run.stderr
