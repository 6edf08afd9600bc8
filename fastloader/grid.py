"""`fastloader show`: a grid of augmented samples as the model sees them (to be written)."""
from __future__ import annotations

HELP = "save a grid of augmented samples, de-normalized and captioned with their classes"
EXAMPLES = """  fastloader show configs/sample.yaml --out grid.png
"""


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, help="PNG file to write")


def run(args) -> int:
    raise NotImplementedError("fastloader show is not written yet")
