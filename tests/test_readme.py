"""The README stays true: its commands are the ones CI runs, and every config key is documented."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fastloader.config import all_dotted_keys
from conftest import REPO

README = (REPO / "README.md").read_text()
CI = (REPO / ".ci" / "run").read_text()


def readme_commands() -> list[str]:
    return [line for block in re.findall(r"```bash\n(.*?)```", README, re.S) for line in block.splitlines()]


def test_ci_runs_the_readme_setup_and_test_commands():
    commands = readme_commands()
    setup = next(c for c in commands if "pip install" in c)
    test = next(c for c in commands if "pytest" in c)
    assert setup.replace("pip install", "pip install -q") in CI
    assert test in CI


def test_every_config_key_is_in_the_reference():
    table = README[README.index("| key | default | meaning |"):]
    documented = set(re.findall(r"`([<>a-z_.]+)`", table))
    missing = [key for key in all_dotted_keys() if key not in documented]
    assert not missing, f"not in the README's config reference: {missing}"


BLOCKS = [(m.start(), m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", README, re.S)]
"""(offset, language, text) of every fenced block, in order."""


def _block_after(marker: str, language: str) -> str:
    """The text of the first block in `language` ("" for output) that opens after the README text `marker`."""
    at = README.index(marker)
    return next(text for start, lang, text in BLOCKS if start > at and lang == language)


def _cpu_run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    """Run as the README's reader would on a CPU box (the GPU hidden, if there is one)."""
    env = {k: v for k, v in os.environ.items() if k != "FASTLOADER_BACKEND"}
    env.update(CUDA_VISIBLE_DEVICES="", FASTLOADER_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


def _shape(line: str, cache_dir: str) -> re.Pattern:
    """A README output line as a pattern: numbers, column padding and hashes may differ, words may not."""
    line = line.replace("/root/.cache/fastloader", "\0")
    pattern = re.escape(re.sub(r"[0-9a-f]{12,}", "\1", line.strip()))
    pattern = re.sub(r"\d+", r"\\d+", pattern)
    pattern = re.sub(r"(\\ )+", r"\\s+", pattern)
    return re.compile(pattern.replace("\1", "[0-9a-f]+").replace("\0", re.escape(cache_dir)))


def test_the_run_commands_output_block_has_the_shape_of_a_real_run(tmp_path):
    """The output under the README's run command: every line but '...' comes out of a real run, up to numbers."""
    pytest.importorskip("nvidia.dali", reason="the README's run reads the DALI line on a CPU box")
    command = next(c for c in readme_commands() if c.startswith(".venv/bin/fastloader bench configs/sample.yaml"))
    result = _cpu_run(["-m", "fastloader.cli", *command.split()[1:]], tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    block = _block_after(command, "")
    lines = [line for line in block.splitlines() if line.strip() and line.strip() != "..."]
    assert len(lines) > 8
    missing = [line for line in lines if not _shape(line, str(tmp_path / "cache")).search(out)]
    assert not missing, f"README lines that a real run does not print:\n{missing}\n---\n{out}"


def test_the_visibility_snippet_prints_the_backend_and_flavour_on_a_cpu_box(tmp_path):
    pytest.importorskip("nvidia.dali", reason="the snippet asks for the dali backend")
    snippet = _block_after("This runs anywhere", "python")
    result = _cpu_run(["-c", snippet], tmp_path)
    assert result.returncode == 0, result.stderr
    for line in _block_after(snippet, "").splitlines():  # the README's output, verbatim
        assert line in result.stdout + result.stderr, line
    assert "WARNING fastloader: backend dali for split 'train'" in result.stderr
    assert "flavour='cpu'" in result.stdout
