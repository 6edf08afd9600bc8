"""The command line's commands, one module each, named after the command (`fastloader bench` is
bench.py). Each provides HELP, EXAMPLES, add_arguments(parser) and run(args), and imports only the
standard library at its top, so that building the parser stays quick. A command's own machinery may
sit beside it (tuning.py: tune's search, which runs bench's rounds)."""
from __future__ import annotations


def no_batch_words(split, samples: int, world_size: int) -> str:
    """The one wording of a split too small for one batch (drop_last: true), with the two fixes, each
    one the config check accepts: with batch_sizes, the smallest of them lowered to a rank's share
    (and batch_size, which must be their largest, with them where that changes)."""
    from ..words import plural
    name, share = split.name, max(1, samples // world_size)
    if split.batch_sizes:
        lowered = list(split.batch_sizes)
        lowered[lowered.index(min(lowered))] = share
        fix = f"--set '{name}.batch_sizes=[{', '.join(map(str, lowered))}]'"
        if max(lowered) != split.batch_size:
            fix += f" --set {name}.batch_size={max(lowered)}"
        return (f"split '{name}' yields no batch per epoch: {plural(samples, 'sample')}, {samples // world_size} a "
                f"rank over world_size {world_size}, fewer than the smallest of {name}.batch_sizes "
                f"({min(split.batch_sizes)}), with drop_last: true; lower it (e.g. {fix}) or set "
                f"{name}.drop_last: false")
    return (f"split '{name}' yields no batch per epoch: {plural(samples, 'sample')}, batch_size "
            f"{split.batch_size} x world_size {world_size} with drop_last: true; lower {name}.batch_size (e.g. --set "
            f"{name}.batch_size={share}) or set {name}.drop_last: false")


def no_batch_error(loader):
    """The error of a command that needs a batch from a split too small for one (drop_last: true):
    a ConfigError (exit 2), naming where the batch size came from and the two fixes."""
    from ..errors import ConfigError
    split = loader.split
    key = f"{split.name}.batch_sizes" if split.batch_sizes else f"{split.name}.batch_size"
    return ConfigError(f"{loader.config.origin(key)}: "
                       f"{no_batch_words(split, loader.num_samples, loader.ranks.world_size)}")
