"""`package.module:attribute` paths of the user's code (a split's source factory, a hook): the
object imported, or a ConfigError that names the key, where its value came from and the fix."""
from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from typing import Any

from .errors import ConfigError, error_text


def import_dotted(spec: str, key: str, where: str, wanted: str) -> Any:
    """The callable `spec` names; `key` and `where` (the file or override that set it) for the
    error, `wanted` what it should be ("the function or class that returns the source")."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = _import(module_name, where)
    except SystemExit as error:  # argparse, or sys.exit(), at the module's top level
        raise ConfigError(f"{where}: {key}: {spec!r}: the module {module_name!r} exited while it was imported "
                          f"(sys.exit({error.code!r}), which argparse calls on a usage error): a module a config "
                          f"names must not parse arguments or exit at its top level; move that under `if __name__ "
                          f"== '__main__':`") from None
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


def _import(module_name: str, where: str) -> Any:
    """The module, found as a script that names it would find it: on sys.path, else in the working
    folder (a script's own folder is on its path, and `python -c` runs in it), else beside the config
    file that names it (`where`). The command line (`fastloader show`, a console script) has neither
    on its path."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        top = module_name.split(".")[0]
        if error.name != top:
            raise
        folders = [os.getcwd()] + ([os.path.dirname(os.path.abspath(where))] if os.path.isfile(where) else [])
        for folder in dict.fromkeys(folders):
            if folder in sys.path or not importlib.machinery.PathFinder.find_spec(top, [folder]):
                continue
            sys.path.append(folder)  # kept: the module's own imports, and forked workers, find it too
            return importlib.import_module(module_name)
        raise
