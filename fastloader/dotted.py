"""`package.module:attribute` paths of the user's code (a split's source factory, a hook): the
object imported, or a ConfigError that names the key, where its value came from and the fix."""
from __future__ import annotations

import importlib
from typing import Any

from .errors import ConfigError, error_text


def import_dotted(spec: str, key: str, where: str, wanted: str) -> Any:
    """The callable `spec` names; `key` and `where` (the file or override that set it) for the
    error, `wanted` what it should be ("the function or class that returns the source")."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or whatever the module raised while it was imported
        raise ConfigError(f"{where}: {key}: {spec!r}: the module {module_name!r} does not import "
                          f"({type(error).__name__}: {error_text(error)}); install it or put its folder on "
                          f"PYTHONPATH") from None
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise ConfigError(f"{where}: {key}: {spec!r}: {module_name} has no callable {attribute!r}; name {wanted}")
    return found
