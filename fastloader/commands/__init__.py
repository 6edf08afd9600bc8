"""The command line's commands, one module each, named after the command (`fastloader bench` is
bench.py). Each provides HELP, EXAMPLES, add_arguments(parser) and run(args), and imports only the
standard library at its top, so that building the parser stays quick."""
from __future__ import annotations


def no_batch_error(loader):
    """The error of a command that needs a batch from a split too small for one (drop_last: true):
    a ConfigError (exit 2), naming where the batch size came from and the two fixes."""
    from ..errors import ConfigError
    from ..words import plural
    name, ranks = loader.split.name, loader.ranks
    return ConfigError(f"{loader.config.origin(f'{name}.batch_size')}: split '{name}' yields no batch per epoch: "
                       f"{plural(loader.num_samples, 'sample')}, batch_size {loader.batch_size} x world_size "
                       f"{ranks.world_size} with drop_last: true; lower {name}.batch_size (e.g. --set "
                       f"{name}.batch_size={max(1, loader.num_samples // ranks.world_size)}) or set "
                       f"{name}.drop_last: false")
