"""`fastloader check`: the environment, the dataset and its unreadable files (to be written)."""
from __future__ import annotations

HELP = "report the environment, summarize the dataset and find unreadable files"
EXAMPLES = """  fastloader check configs/sample.yaml
"""


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise NotImplementedError("fastloader check is not written yet")
