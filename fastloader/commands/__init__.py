"""The command line's commands, one module each, named after the command (`fastloader bench` is
bench.py). Each provides HELP, EXAMPLES, add_arguments(parser) and run(args), and imports only the
standard library at its top, so that building the parser stays quick."""
from __future__ import annotations


def no_batch_words(name: str, samples: int, batch_size: int, world_size: int) -> str:
    """The one wording of a split too small for one batch (drop_last: true), with the two fixes."""
    from ..words import plural
    return (f"split '{name}' yields no batch per epoch: {plural(samples, 'sample')}, batch_size {batch_size} x "
            f"world_size {world_size} with drop_last: true; lower {name}.batch_size (e.g. --set "
            f"{name}.batch_size={max(1, samples // world_size)}) or set {name}.drop_last: false")


def no_batch_error(loader):
    """The error of a command that needs a batch from a split too small for one (drop_last: true):
    a ConfigError (exit 2), naming where the batch size came from and the two fixes."""
    from ..errors import ConfigError
    name = loader.split.name
    return ConfigError(f"{loader.config.origin(f'{name}.batch_size')}: "
                       f"{no_batch_words(name, loader.num_samples, loader.batch_size, loader.ranks.world_size)}")
