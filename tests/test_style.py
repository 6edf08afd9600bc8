"""The code style the project keeps (pyproject.toml's [tool.ruff]): line length, unused imports and
names, import order. Run as part of the suite so that CI fails on it like on any other test."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

ruff = pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")


def test_ruff_finds_nothing_to_fix():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"ruff check (`ruff check --fix .` sorts imports):\n{result.stdout}{result.stderr}"
