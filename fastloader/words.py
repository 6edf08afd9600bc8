"""How counts are written in messages: "1 shard", "2 shards", "no problems". One helper, so that no
message says "1 shards" or "1 ranks".

Only the standard library: the command line's modules import it at their top.
"""
from __future__ import annotations

import os

_IRREGULAR = {"is": "are", "was": "were", "has": "have"}


def plural_of(noun: str) -> str:
    """'shard' -> 'shards', 'class' -> 'classes', 'batch' -> 'batches', 'is' -> 'are'."""
    if noun in _IRREGULAR:
        return _IRREGULAR[noun]
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def plural(count: int, noun: str, zero: str | None = None) -> str:
    """'1 shard', '3 shards', '2 classes'; `zero` words a count of 0 ('no' gives 'no problems')."""
    word = noun if count == 1 else plural_of(noun)
    return f"{zero if count == 0 and zero is not None else count} {word}"


def container_noun(path: str) -> str:
    """'tar shard', 'parquet file', 'arrow file': what a container file is, in a count's words."""
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    return "tar shard" if suffix == "tar" else f"{suffix or 'table'} file"


def containers_words(paths) -> str:
    """'9 tar shards', '1 parquet file', '5 tar shards, 4 parquet files': a split's container files."""
    counts: dict[str, int] = {}
    for path in paths:
        noun = container_noun(path)
        counts[noun] = counts.get(noun, 0) + 1
    return ", ".join(plural(count, noun) for noun, count in sorted(counts.items()))
