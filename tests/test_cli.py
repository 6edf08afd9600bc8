"""The command line as a user runs it: a real subprocess, real files, exit codes and output."""
from __future__ import annotations

import importlib
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cpu_only_env, write_solid_dataset

from fastloader.cli import main

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
    assert re.search(r"torch +cpu +2 workers +\d+ +\d+-\d+ +\d+\.\d +\d+\.\d% +\d+\.\d\d \+ \d+\.\d\d s "
                     r"+\d+\.\d [MG]iB", result.stdout)
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


def test_version_and_help(tmp_path):
    from fastloader import __version__
    assert run("--version", cache_dir=tmp_path).stdout.strip() == f"fastloader {__version__}"
    help_text = run("bench", "--help", cache_dir=tmp_path).stdout
    assert "--set KEY=VALUE" in help_text and "fastloader bench configs/sample.yaml" in help_text


# ---------------------------------------------------------------------------------------------
# The exit status: one rule for every command (fastloader/cli.py), checked in-process with
# fastloader.cli.main, which returns the status `fastloader` exits with; the subprocess tests above
# and below show the real exit status. The CPU: the commands read a small dataset with no workers.
# ---------------------------------------------------------------------------------------------

COMMAND_ARGS = {"bench": ["--batches", "1", "--seconds", "0", "--rounds", "1"], "show": ["--out", "{tmp}/grid.png"],
                "check": ["--workers", "0"], "cache": ["--out", "{tmp}/cache", "--workers", "0"],
                "pack": ["--split", "val", "--out", "{tmp}/shards"],
                "tune": ["--out", "{tmp}/tuned.yaml", "--seconds", "0.1", "--time-limit", "1"]}
"""What each command needs besides its config, to run quickly on the small dataset."""
BAD_OPTION = {"bench": (["--rounds", "0"], "--rounds must be >= 1, got 0"),
              "show": (["--n", "0"], "argument --n: must be a positive integer, got 0"),
              "check": (["--workers", "-1"], "--workers: must be 0 or more, got -1"),
              "cache": (["--short-side", "0"], "--short-side: must be a positive number of pixels, got 0"),
              "pack": (["--per-shard", "0"], "--per-shard: must be 1 or more, got 0"),
              "tune": (["--seconds", "0"], "--seconds must be > 0, got 0.0")}
"""Per command, an option value it refuses (argparse's check or the command's own) and the message."""


@pytest.fixture
def small_config(tmp_path) -> Path:
    """A YAML config over 15 train and 15 val images (3 classes), batches of 4 at 32 px, no workers."""
    root = write_solid_dataset(tmp_path / "data")
    path = tmp_path / "small.yaml"
    path.write_text(f"dataset: {{root: {root}}}\noutput: {{device: cpu}}\nworkers: {{num_workers: 0}}\n"
                    "train: {batch_size: 4, transform: {size: 32}}\nval: {batch_size: 4, transform: {size: 32}}\n")
    return path


def call(command: str, config, *extra: str, tmp_path, debug: str = "") -> int:
    """fastloader [--debug] COMMAND CONFIG ARGS... [--debug], in this process; its exit status."""
    args = [a.format(tmp=tmp_path) for a in COMMAND_ARGS[command]]
    before, after = (["--debug"] if debug == "before" else []), (["--debug"] if debug == "after" else [])
    return main([*before, command, str(config), *args, *extra, *after])


@pytest.mark.parametrize("command", COMMAND_ARGS)
def test_every_command_exits_0_when_done_and_2_on_each_error_the_user_can_fix(command, small_config, tmp_path,
                                                                               capsys):
    assert call(command, small_config, tmp_path=tmp_path) == 0
    done = {"bench": "round 1/1 torch: 4 images in 1 batch ", "show": "wrote {tmp}/grid.png: 12 samples",
            "check": "no problems in 30 files", "cache": "split val: 15 images",
            "pack": "split val: 15 samples", "tune": "wrote {tmp}/tuned.yaml"}[command]
    assert done.format(tmp=tmp_path) in capsys.readouterr().out
    cases = {"an unknown key": (["--set", "train.bach_size=3"], "override 'train.bach_size': unknown key "
                                                               "'train.bach_size'; did you mean 'train.batch_size'?"),
             "a bad option value": BAD_OPTION[command],
             "an unknown option": (["--frobnicate"], "unrecognized arguments: --frobnicate")}
    for case, (extra, message) in cases.items():
        assert call(command, small_config, *extra, tmp_path=tmp_path) == 2, case
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (case, err)
    for config, message in ((tmp_path / "nope.yaml", "config file 'nope.yaml' not found"),
                            (tmp_path, f"config file '{tmp_path}' is a folder, not a YAML file. Pass a YAML file in "
                                       f"it, such as '{small_config}'")):
        assert call(command, config if config == tmp_path else "nope.yaml", tmp_path=tmp_path) == 2
        assert message in capsys.readouterr().err


def test_options_out_of_range_or_naming_a_folder_for_a_file_are_refused_in_one_line(small_config, tmp_path, capsys):
    """bench --step-ms -5 used to run; check --exclude-list DIR checked every file, then printed
    "[Errno 21] Is a directory". Each is refused before any work, naming the option and the fix."""
    folder = tmp_path / "lists"
    folder.mkdir()
    cases = [(["bench", "--step-ms", "-5"], "fastloader: error: --step-ms must be >= 0, got -5\n"),
             (["check", "--exclude-list", str(folder)],
              f"fastloader: error: --exclude-list {folder}: is a folder; name the file to write the problem files "
              f"to, e.g. --exclude-list {folder / 'bad-files.txt'}\n"),
             (["bench", "--json", str(folder)],
              f"fastloader: error: --json {folder}: is a folder; name the file to write, e.g. --json "
              f"{folder / 'bench.json'}\n")]
    for (command, *extra), message in cases:
        assert main([command, str(small_config), *extra]) == 2, (command, extra)
        captured = capsys.readouterr()
        assert captured.err.endswith(message) and "Traceback" not in captured.err, captured.err
        assert "files" not in captured.out and "round" not in captured.out, captured.out  # nothing ran
    assert main(["check", str(small_config), "--exclude-list", str(tmp_path / "new" / "bad.txt")]) == 0
    assert (tmp_path / "new" / "bad.txt").read_text().startswith("# written by fastloader check")


def test_check_reads_a_config_from_a_pipe_with_relative_paths_from_the_working_directory(tmp_path):
    """bash's `<(cat job.yaml)` is a pipe (/dev/fd/63), not a regular file: it used to be "not found".
    It has no folder, so its relative dataset.root is the working directory's."""
    write_solid_dataset(tmp_path / "data")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "job.yaml").write_text("dataset: {root: data}\noutput: {device: cpu}\n"
                                                "train: {batch_size: 4, transform: {size: 32}}\n")
    command = f"{shlex.join(FASTLOADER)} check <(cat jobs/job.yaml)"
    result = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                            env=cpu_only_env(tmp_path / "cache", PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr
    assert "no problems in 15 files" in result.stdout, result.stdout


@pytest.mark.parametrize("command", ["bench", "show", "tune"])
def test_a_split_that_yields_no_batch_exits_2_naming_the_batch_size_and_the_fixes(command, small_config, tmp_path,
                                                                                    capsys):
    assert call(command, small_config, "--set", "train.batch_size=16", tmp_path=tmp_path) == 2
    err = capsys.readouterr().err
    assert ("fastloader: error: override 'train.batch_size': split 'train' yields no batch per epoch: 15 samples, "
            "batch_size 16 x world_size 1 with drop_last: true; lower train.batch_size (e.g. --set "
            "train.batch_size=15) or set train.drop_last: false") in err
    assert not (tmp_path / "grid.png").exists()


@pytest.mark.parametrize("command", COMMAND_ARGS)
def test_an_internal_failure_exits_3_and_debug_before_or_after_the_command_shows_its_traceback(
        command, small_config, tmp_path, capsys, monkeypatch):
    """A failure no config or option can cause (a bug) is injected by replacing the command's run: what
    is tested is how the command line reports it, the same for every command."""
    def bug(args):
        return {}["missing"]
    monkeypatch.setattr(importlib.import_module(f"fastloader.commands.{command}"), "run", bug)
    assert call(command, small_config, tmp_path=tmp_path) == 3
    err = capsys.readouterr().err
    assert ("fastloader: internal error: KeyError: 'missing'. This is a bug or a broken install, not your config: "
            "run again with --debug for the traceback, and report it") in err and "Traceback" not in err
    for position in ("before", "after"):
        assert call(command, small_config, tmp_path=tmp_path, debug=position) == 3, position
        err = capsys.readouterr().err
        assert "Traceback" in err and "in bug" in err and "the traceback is above" in err, position


def test_no_command_and_an_unknown_command_exit_2_and_help_and_version_exit_0(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: fastloader") and "fastloader: error: name a command: bench, show, check, cache" in err
    assert "exit status:" in err and "3    an internal failure" in err
    assert main(["--debug"]) == 2
    assert main(["frobnicate", "configs/sample.yaml"]) == 2
    assert "argument COMMAND: invalid choice: 'frobnicate'" in capsys.readouterr().err
    assert main(["--version"]) == 0 and main(["check", "--help"]) == 0
    out = capsys.readouterr().out
    assert "exit status:\n  0    done\n  1    some files cannot be read" in out  # check's own 1


def test_debug_before_and_after_the_command_shows_debug_logs_and_the_traceback_and_keeps_status_2(small_config,
                                                                                                   tmp_path):
    """The real exit status and logging of `fastloader [--debug] bench ... [--debug]`. The DEBUG line is the
    screening read from its disk cache, which the first (in-process) run writes."""
    cache_dir = os.environ["FASTLOADER_CACHE_DIR"]  # conftest's, shared with the subprocesses
    no_batch = ["--set", "train.batch_size=16"]
    assert call("bench", small_config, *no_batch, tmp_path=tmp_path) == 2
    for debug in (["--debug", "bench", str(small_config), *no_batch], ["bench", str(small_config), *no_batch,
                                                                         "--debug"]):
        result = run(*debug, cache_dir=cache_dir)
        assert result.returncode == 2, (debug, result.stderr)
        assert "DEBUG fastloader: screening of" in result.stderr, debug
        assert "Traceback" in result.stderr and "fastloader.errors.ConfigError" in result.stderr, debug
        assert result.stderr.rstrip().splitlines()[-1].startswith("fastloader: error: override 'train.batch_size'")


# ---------------------------------------------------------------------------------------------
# Messages whose fix must work (issue 33, item 17): each runs the real command, applies the fix the
# message gives, and runs it again. The CPU, a small dataset, no workers. (pack's --out and
# --shard-size: tests/test_pack.py.)
# ---------------------------------------------------------------------------------------------

QUICK = {"bench": ["--batches", "1", "--seconds", "0", "--rounds", "1"], "check": ["--workers", "0"]}


def quick(command: str, config, *extra: str) -> int:
    return main([command, str(config), *QUICK[command], *extra])


def test_a_dataset_root_one_level_too_deep_says_to_set_its_parent_which_works(small_config, tmp_path, capsys):
    too_deep = tmp_path / "data" / "train"
    assert quick("check", small_config, "--set", f"dataset.root={too_deep}") == 2
    err = capsys.readouterr().err
    assert (f"dataset.root '{too_deep}' is a split folder itself, one level too deep: its folders (a_red, b_green, "
            f"c_blue) hold images, and 'train' is beside it; set dataset.root to '{tmp_path / 'data'}'") in err
    fix = re.search(r"\(--set (dataset\.root=\S+)\)", err).group(1)
    assert quick("check", small_config, "--set", fix) == 0


def test_a_missing_splits_suggested_section_is_valid_as_given(small_config, tmp_path, capsys):
    (tmp_path / "data" / "val").rename(tmp_path / "data" / "valid")
    assert quick("bench", small_config, "--split", "valid") == 2
    err = capsys.readouterr().err
    assert "no split 'valid' (splits defined: train, val); did you mean 'val'?" in err
    section = re.search(r"e\.g\. '(valid: \{.*?\})'", err).group(1)
    assert section == "valid: {mode: eval, batch_size: 64}"
    small_config.write_text(small_config.read_text() + section + "\n")
    assert quick("bench", small_config, "--split", "valid") == 0


def test_cache_rebuild_commands_keep_the_overrides_and_the_real_default_short_side(small_config, tmp_path, capsys,
                                                                                   caplog):
    data = tmp_path / "data"
    small_config.write_text(small_config.read_text().replace(str(data), str(tmp_path / "moved")))
    cache = tmp_path / "cache"
    mine = ["--set", f"dataset.root={data}", "--set", f"dataset.cache={cache}", "--set", "val.transform.size=40"]

    def suggested(err: str) -> list[str]:
        command = shlex.split(re.search(r"`(fastloader cache [^`]*)`", err).group(1))
        assert "--short-side" not in command  # 48 needed (40 / 0.875); the command's default, 256, serves
        assert command[command.index("--set") + 1] == f"dataset.root={data}"
        return command[1:]

    assert quick("bench", small_config, "--split", "val", *mine) == 2
    assert main(suggested(capsys.readouterr().err)) == 0  # the command the error gave, as given
    caplog.set_level(logging.INFO, logger="fastloader")
    assert quick("bench", small_config, "--split", "val", *mine) == 0
    assert f"split 'val' reads decoded pixels from the cache {cache / 'val'}" in caplog.text
    assert main(["cache", str(small_config), "--split", "val", "--short-side", "16", "--out", str(cache),
                 "--set", f"dataset.root={data}"]) == 0
    assert quick("bench", small_config, "--split", "val", *mine) == 2
    err = capsys.readouterr().err
    assert "it was built with --short-side 16, and split 'val' (eval, size 40) needs at least 45" in err
    assert main(suggested(err)) == 0
    assert quick("bench", small_config, "--split", "val", *mine) == 0


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_dataset_root_that_is_a_file_or_a_fifo_says_what_it_is(small_config, tmp_path, capsys, kind):
    odd = tmp_path / "root"
    odd.write_text("not a folder") if kind == "file" else os.mkfifo(odd)
    assert quick("check", small_config, "--set", f"dataset.root={odd}") == 2
    err = capsys.readouterr().err
    what = "a file" if kind == "file" else "a FIFO (named pipe)"
    assert (f"dataset.root: '{odd}' is {what}, not a folder; set dataset.root to the folder that holds the split "
            f"folders (or pass --set dataset.root=PATH)") in err
    assert quick("check", small_config, "--set", f"dataset.root={tmp_path / 'data'}") == 0


def test_check_counts_a_broken_torchvision_as_a_problem_and_the_fix_clears_it(small_config, tmp_path):
    """A torchvision that does not import was reported, then 'no problems', exit 0. A real broken
    package: a `torchvision` folder first on sys.path whose import fails as a mismatched build's does."""
    shadow = tmp_path / "shadow" / "torchvision"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('libtorchvision.so: undefined symbol: _ZN3c10')\n")
    broken = run("check", str(small_config), "--workers", "0", cache_dir=tmp_path / "c",
                 PYTHONPATH=os.pathsep.join([str(shadow.parent), str(REPO)]))
    assert broken.returncode == 1, broken.stderr[-2000:]
    assert (f"problem: torchvision at {shadow} does not import (ImportError: libtorchvision.so: undefined symbol: "
            f"_ZN3c10): reinstall it (pip install --force-reinstall torchvision), or remove what shadows it on "
            f"sys.path") in broken.stdout
    fixed = run("check", str(small_config), "--workers", "0", cache_dir=tmp_path / "c", PYTHONPATH=str(REPO))
    assert fixed.returncode == 0 and "problem" not in fixed.stdout.replace("no problems", ""), fixed.stdout
