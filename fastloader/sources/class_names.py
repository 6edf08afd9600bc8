"""A file of class names in label order, one a line: what `fastloader pack` writes beside the shards
and what dataset.classes may name. A leaf, read by the config and by the formats alike."""
from __future__ import annotations


def read_class_names(path: str) -> tuple[str, ...]:
    """A file of class names in label order, one a line (as `fastloader pack` writes `<split>-classes.txt`);
    blank lines and the spaces around a name are left out. OSError or ValueError say what is wrong."""
    with open(path, encoding="utf-8") as handle:
        names = tuple(line.strip() for line in handle if line.strip())
    if not names:
        raise ValueError("it holds no class name (one a line)")
    repeated = sorted({name for name in names if names.count(name) > 1}) if len(set(names)) < len(names) else []
    if repeated:
        raise ValueError(f"it names {repeated[0]!r} twice; each class once, in label order")
    return names
