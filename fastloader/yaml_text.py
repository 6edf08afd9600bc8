"""YAML text -> Python values, refusing what YAML lets pass silently.

Why a loader of our own: PyYAML's safe loader keeps the last of two equal keys (`batch_size: 4` then
`batch_size: 8` trains with 8, and nobody is told), and accepts keys that are numbers or null, which
no config key is. Both are refused here with the line of each, so that a config means one thing.
"""
from __future__ import annotations

from typing import Any

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names one key twice."""


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader whose mappings refuse a key given twice (the line of each in the message)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                    seen[key] = key_node.start_mark.line
                except TypeError:  # an unhashable key: the constructor below names it
                    continue
                if first is not None:
                    raise DuplicateKeyError(f"the key {key!r} is given twice, on line {first + 1} and on line "
                                            f"{key_node.start_mark.line + 1}; YAML would keep only the last "
                                            f"without a word: delete one of them")
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """The value of a YAML document, or DuplicateKeyError / yaml.YAMLError (with its line)."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
