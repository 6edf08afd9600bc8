"""The README stays true: its commands are the ones CI runs, and every config key is documented."""
from __future__ import annotations

import re

from fastloader.config import _all_dotted_keys
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
    missing = [key for key in _all_dotted_keys() if key not in documented]
    assert not missing, f"not in the README's config reference: {missing}"
