"""What a failed build leaves behind: nothing. A build that fails lets go of the user's source (the
process's table of opened sources) (issue 68.11). Device: CPU."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
from conftest import base_config, write_textured_dataset

from fastloader import build_loader
from fastloader.errors import CacheError
from fastloader.sources import protocol


class ListSource:
    """A user's source over image files: what build_loader(source=...) is given."""

    def __init__(self, root: Path):
        self.paths = sorted(p for p in (root / "train").rglob("*.png"))
        self.name = f"list of {len(self.paths)}"

    def samples(self):
        classes = sorted({p.parent.name for p in self.paths})
        names = [f"{p.parent.name}/{p.name}" for p in self.paths]
        return names, [classes.index(p.parent.name) for p in self.paths], classes

    def read(self, item):
        return self.paths[item].read_bytes()

    def identity(self):
        return self.name


def _held(source) -> int:
    """How many entries of this process's source table hold `source`."""
    return sum(held is source for held in list(protocol._opened.values()))


def test_a_build_that_fails_after_opening_the_source_lets_go_of_it(tmp_path):
    root = write_textured_dataset(tmp_path / "d", per_class=2)
    source = ListSource(root)
    config = base_config(root, dataset={"root": str(root), "cache": str(tmp_path / "no-such-cache")})
    for _ in range(3):
        with pytest.raises(CacheError, match="no-such-cache"):
            build_loader(config, "train", source=source)
    assert _held(source) == 0
    gone = weakref.ref(source)
    del source
    gc.collect()
    assert gone() is None
