"""A plain script never hangs or dies: no `if __name__ == "__main__":` guard, `python -c`, any split size.

Each case is a real Python process with a time limit, over more files than the screening does in
process (screening.IN_PROCESS_UP_TO), so the screening pool starts; the torch backend also
starts DataLoader workers. No worker may run the user's script again.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import REALPHOTOS, cpu_only_env, env_without, requires_realphotos
from PIL import Image
from test_resume import BACKENDS

from fastloader.screening import IN_PROCESS_UP_TO

FILES = IN_PROCESS_UP_TO + 100


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """FILES tiny JPEGs in two classes: past the in-process screening limit, cheap to decode."""
    root = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(0)
    tiles = [Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)) for _ in range(8)]
    payloads = []
    for tile in tiles:
        path = root / "tile.jpg"
        tile.save(path, quality=90)
        payloads.append(path.read_bytes())
    for i in range(FILES):
        folder = root / "train" / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.jpg").write_bytes(payloads[i % len(payloads)])
    return root


def script_for(root, backend: str) -> str:
    """What a user writes first: build a loader at module level and loop over it. No guard."""
    config = {"backend": backend, "dataset": {"root": str(root)}, "workers": {"num_workers": 2},
              "train": {"batch_size": 100, "transform": {"size": 8}}}
    return textwrap.dedent(f"""
        import json
        import fastloader
        loader = fastloader.build_loader({config!r}, "train")
        seen = sum(len(labels) for _, labels in loader)
        print(json.dumps({{"backend": loader.backend, "samples": loader.num_samples, "seen": seen}}))
    """)


def run_script(args: list[str], cache_dir, cwd) -> dict:
    environment = env_without("FASTLOADER_BACKEND")
    environment["FASTLOADER_CACHE_DIR"] = str(cache_dir)
    process = subprocess.Popen([sys.executable, *args], cwd=cwd, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the script and every process it started
        out, err = process.communicate()
        pytest.fail(f"the script hung (killed after 90 s); stderr: {err[-2000:]}")
    assert process.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "BrokenProcessPool" not in err, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unguarded_script_file_screens_and_loads_every_file(many_files, tmp_path, backend):
    script = tmp_path / "train_unguarded.py"
    script.write_text(script_for(many_files, backend))
    result = run_script([str(script)], cache_dir=tmp_path / "cache", cwd=tmp_path)
    assert result == {"backend": backend, "samples": FILES, "seen": FILES // 100 * 100}


def test_python_dash_c_screens_and_loads_every_file(many_files, tmp_path):
    result = run_script(["-c", script_for(many_files, "torch")], cache_dir=tmp_path / "cache",
                        cwd=tmp_path)
    assert result == {"backend": "torch", "samples": FILES, "seen": FILES // 100 * 100}


ENDINGS = {"returns": ("", 0), "exits 3": ("sys.exit(3)", 3), "raises": ("raise ValueError('the trainer broke')", 1)}
"""How a script ends mid-epoch, and the exit status it must end with."""


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_script_that_ends_mid_epoch_exits_with_its_own_status(many_files, tmp_path, backend, ending):
    """A loader's iterator kept alive in a function's frame and in a global, batches with a model step
    between, then the script ends: it exits with its own status (0, sys.exit's, 1 for an uncaught
    error), without a crash in a loader's thread (DALI's: 'terminate called without an active
    exception', SIGABRT, seen in most runs) and without a traceback but the script's own."""
    statement, status = ENDINGS[ending]
    config = {"backend": backend, "dataset": {"root": str(many_files)}, "workers": {"num_workers": 2},
              "train": {"batch_size": 64, "transform": {"size": 16}}}
    script = textwrap.dedent(f"""
        import sys, time
        import fastloader
        kept = []

        def train():
            loader = fastloader.build_loader({config!r}, "train")
            batches = iter(loader)
            kept.append(batches)
            for step in range(3):
                images, labels = next(batches)
                time.sleep(0.05)  # the model step
            print("trained", flush=True)
            {statement}

        train()
    """)
    path = tmp_path / "ends.py"
    path.write_text(script)
    environment = env_without("FASTLOADER_BACKEND")
    environment["FASTLOADER_CACHE_DIR"] = str(tmp_path / "cache")
    process = subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the script hung at its end (killed after 90 s); stderr: {err[-2000:]}")
    assert "trained" in out, err[-3000:]
    assert process.returncode == status, (process.returncode, err[-3000:])
    assert "terminate called" not in err and "Exception in thread" not in err, err[-3000:]
    tracebacks = err.count("Traceback")
    assert tracebacks == (1 if ending == "raises" else 0), err[-3000:]
    if ending == "raises":
        assert err.rstrip().endswith("ValueError: the trainer broke"), err[-3000:]


@requires_realphotos
@pytest.mark.timeout(180)
def test_a_dali_script_that_ends_mid_epoch_beside_two_busy_loops_exits_cleanly(tmp_path):
    """Device: CPU (DALI's CPU flavour). The real photos linked twice (800 files), batches of 256:
    the script returns after one batch, while DALI decodes the next ones, on a machine whose two
    busy loops (started once the loader is built) make that take seconds. The exit hook used to give
    DALI one second, then take the pipeline off DALI's own exit hook: its executor still decoded as
    the process ended, and it aborted ('terminate called without an active exception', rc -6; 3 of 3
    runs here). The exit now waits for the batch in progress, up to workers.timeout."""
    root = tmp_path / "photos"
    for photo in sorted((REALPHOTOS / "train").glob("*/*")):
        folder = root / "train" / photo.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        for copy in range(2):
            (folder / f"{copy}_{photo.name}").symlink_to(photo)
    config = {"backend": "dali", "dataset": {"root": str(root)}, "output": {"device": "cpu"},
              "workers": {"num_workers": 2}, "train": {"batch_size": 256, "transform": {"size": 224}}}
    script = textwrap.dedent(f"""
        import sys, time
        import fastloader

        def main():
            batches = iter(fastloader.build_loader({config!r}, "train"))
            print("built", flush=True)
            sys.stdin.readline()  # the busy loops run
            next(batches)
            time.sleep(0.6)  # the model step
            print("returns", flush=True)

        main()
    """)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env=cpu_only_env(tmp_path / "cache"),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    busy = []
    try:
        assert process.stdout.readline() == "built\n", process.communicate(timeout=60)[1][-3000:]
        busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
        process.stdin.write("go\n")
        process.stdin.flush()
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the script hung at its end (killed after 120 s); stderr: {err[-2000:]}")
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()
    assert out == "returns\n", err[-3000:]
    assert "terminate called" not in err, err[-3000:]
    assert process.returncode == 0, (process.returncode, err[-3000:])
