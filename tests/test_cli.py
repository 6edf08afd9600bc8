"""The command line as a user runs it: a real subprocess, real files, exit codes and output."""
from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, cpu_only_env

FASTLOADER = [sys.executable, "-m", "fastloader.cli"]


def run(*args, cache_dir, **env):
    """The command as a user on a CPU-only machine runs it (the GPU path: test_cuda.py)."""
    environment = cpu_only_env(cache_dir, **env)
    return subprocess.run([*FASTLOADER, *args], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=240)


def test_bench_runs_the_embedded_demo_on_a_fresh_cache(tmp_path):
    result = run("bench", "configs/sample.yaml", "--batches", "3", "--seconds", "0.2", cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "generated the embedded demo dataset (first use): 300 JPEGs" in result.stderr
    assert ("split train: 240 samples, 7 batches/epoch of 32, batches [32, 3, 128, 128] float32, classes: circle, "
            "cross, square, stripes, triangle") in result.stdout
    assert ("3 rounds per backend, each timing at least 0.2 s and 3 batches after draining the prefetched ones; "
            "model step 0 ms; the table gives the median round") in result.stdout
    assert re.search(r"torch +cpu +2 workers +\d+ +\d+-\d+ +\d+\.\d +\d+\.\d% +\d\.\d\d s +\d+\.\d [MG]iB",
                     result.stdout)
    assert "3/3 rounds" in result.stderr
    again = run("bench", "configs/sample.yaml", "--split", "val", "--batches", "1", "--seconds", "0",
                "--rounds", "1", cache_dir=tmp_path)
    assert again.returncode == 0 and "generated" not in again.stderr
    assert "split val: 60 samples, 2 batches/epoch of 32" in again.stdout


def test_config_errors_exit_2_with_a_message_and_no_traceback(tmp_path):
    result = run("bench", "configs/sample.yaml", "--set", "train.bach_size=3", cache_dir=tmp_path)
    assert result.returncode == 2
    assert "fastloader: error: override 'train.bach_size': unknown key 'train.bach_size'; did you mean " \
           "'train.batch_size'?" in result.stderr
    assert "Traceback" not in result.stderr
    missing = run("bench", "nope.yaml", cache_dir=tmp_path)
    assert missing.returncode == 2 and "config file 'nope.yaml' not found" in missing.stderr


def test_environment_forces_the_dali_backend_which_runs_its_cpu_flavour_without_a_gpu(tmp_path):
    result = run("bench", "configs/sample.yaml", "--batches", "2", "--seconds", "0", "--rounds", "1",
                 cache_dir=tmp_path, FASTLOADER_BACKEND="dali")
    assert result.returncode == 0, result.stderr
    assert ("WARNING fastloader: backend dali for split 'train': backend: dali (from environment variable "
            "FASTLOADER_BACKEND); no CUDA GPU is available, so DALI runs its CPU flavour") in result.stderr
    assert re.search(r"dali +cpu +dali cpu, 2 threads +\d+", result.stdout)


def test_debug_shows_tracebacks(tmp_path):
    quiet = run("bench", "configs/sample.yaml", "--set", "train.batch_size=0", cache_dir=tmp_path)
    loud = run("bench", "configs/sample.yaml", "--set", "train.batch_size=0", "--debug", cache_dir=tmp_path)
    message = "train.batch_size: must be a positive integer, got 0"
    assert quiet.returncode == 2 and message in quiet.stderr and "Traceback" not in quiet.stderr
    assert loud.returncode != 0 and message in loud.stderr and "Traceback" in loud.stderr


def test_version_and_help(tmp_path):
    from fastloader import __version__
    assert run("--version", cache_dir=tmp_path).stdout.strip() == f"fastloader {__version__}"
    help_text = run("bench", "--help", cache_dir=tmp_path).stdout
    assert "--set KEY=VALUE" in help_text and "fastloader bench configs/sample.yaml" in help_text
