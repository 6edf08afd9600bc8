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


def one_line(error: yaml.YAMLError) -> str:
    """PyYAML's message on one line: "line 3, column 9: expected ',' or ']', but got ':' (while parsing a
    flow sequence that starts on line 2, column 15)". Why: PyYAML writes four lines, each repeating
    the file's name, where every other config error is one line that names the file once."""
    problem = getattr(error, "problem", None)
    if not problem:
        return " ".join(str(error).split())
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    text = f"{where}{problem}"
    if context:
        started = ""
        if context_mark is not None and (mark is None or (context_mark.line, context_mark.column)
                                          != (mark.line, mark.column)):
            started = f" that starts on line {context_mark.line + 1}, column {context_mark.column + 1}"
        text += f" ({context}{started})"
    if "'\\t'" in problem:
        text += "; indent with spaces: YAML does not allow tabs there"
    note = getattr(error, "note", None)
    return " ".join((f"{text}; {note}" if note else text).split())


def load(text: str) -> Any:
    """The value of a YAML document, or DuplicateKeyError / yaml.YAMLError (with its line)."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
