"""A config value as messages show it: as the YAML file would write it (a list in brackets, a
string quoted), so that an error quotes what the user wrote."""
from __future__ import annotations

from typing import Any

import yaml


def show_value(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    text = repr(value) if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("\n...").strip()
