"""The user's own transforms (docs/transforms.md): a per-sample hook, a per-batch hook and a DALI
graph function, each from `package.module:function` in the config or a function given to
build_loader; named by what they are (the loader's state records the names), and called so that
what they give is checked and what they raise names them, the sample and their traceback.

Why seeded so: a sample hook draws from a torch.Generator seeded with the sample's seed (a pure
function of the config's seed, the epoch and the sample: fastloader.order), so its draws are the
same with any number of workers, on any rank, on either backend and after a resume; a batch hook
gets the batch's sample seeds, a graph function their DataNode. torchvision's v2 transforms take no
generator (pytorch/vision#7027) and draw from torch's global one: `with_global_rng` runs such a
transform with the global generators seeded from the sample's, and puts them back after. Those
generators are the process's, the trainer's too: such a hook runs only where nothing else draws
meanwhile, in the torch backend's workers (or on the training thread, between the trainer's own
draws) and, on DALI, in processes of its own (dali_loader/hook_processes.py), never on a thread
beside the trainer's.

A hook's failure is the user's bug, never a bad file's: a HookError, which no backend skips.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import pickle
import random
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch

from .dotted import import_dotted
from .errors import ConfigError, HookError, error_text

log = logging.getLogger("fastloader")

HOOK_KINDS = ("sample_hook", "batch_hook", "graph_hook")
"""The kinds of hook, as build_loader's arguments name them (Config.hook_settings: their config keys)."""


def function_name(function: Any) -> str:
    """`module:qualname` of a function, or of an object's class (a torchvision Compose); a hook may
    say its own (`hook_name`, as with_global_rng's does)."""
    own = getattr(function, "hook_name", None)
    if isinstance(own, str) and own:
        return own
    named = function if hasattr(function, "__qualname__") else type(function)
    return f"{getattr(named, '__module__', '?')}:{getattr(named, '__qualname__', type(function).__name__)}"


@dataclass(frozen=True)
class Hook:
    """One of the user's hooks: the function, the kind (HOOK_KINDS), where it was set (a config key
    or a build_loader argument), its name and the version it gives (its `version` attribute)."""
    function: Callable
    kind: str
    key: str
    name: str
    version: str = ""
    spec: str | None = None
    """The `package.module:function` it was imported from; None for a function given in code."""

    @property
    def draws_globally(self) -> bool:
        """Whether the hook reseeds the global generators (with_global_rng): never on a thread
        beside the trainer's."""
        return isinstance(self.function, with_global_rng)

    @property
    def label(self) -> str:
        """The hook as messages name it: its key, its name and version."""
        version = f" (version {self.version})" if self.version else ""
        return f"{self.key} {self.name}{version}"

    def record(self) -> str:
        """What the loader's state records of it: the name, what tells apart two hooks of that name
        (fingerprint), and the version where it gives one."""
        mark = fingerprint(self.function)
        name = f"{self.name}#{mark}" if mark else self.name
        return f"{name}@{self.version}" if self.version else name

    def __reduce__(self):
        """Where a worker is spawned, an imported hook travels as its path and is imported there."""
        if self.spec is not None:
            return _imported_hook, (self.spec, self.kind, self.key)
        return object.__reduce__(self)

    def on_sample(self, image: torch.Tensor, seed: int, sample: str) -> torch.Tensor:
        """The sample hook on one image: uint8 [3, H, W] in, the same shape and dtype out."""
        generator = torch.Generator()
        generator.manual_seed(int(seed))
        try:
            out = self.function(image, generator)
        except (Exception, SystemExit, KeyboardInterrupt) as error:  # a hook cannot end the process from here
            raise HookError(self.failure_words(error, f"sample {sample!r} (seed {int(seed)})")) from error
        if not (isinstance(out, torch.Tensor) and out.dtype == torch.uint8 and out.shape == image.shape
                and out.device.type == "cpu"):
            raise HookError(f"{self.label} returned {_what(out)} for sample {sample!r}; a sample hook returns a "
                            f"uint8 torch tensor of the shape it is given, [3, {image.shape[1]}, {image.shape[2]}], "
                            f"on the CPU (it may not resize: the batch is stacked at the split's transform.size)")
        return out

    def on_batch(self, images: torch.Tensor, labels: torch.Tensor,
                 seeds: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch hook on a normalized batch: (images, labels) in, the same shapes, dtypes and
        device out."""
        seeds = torch.from_numpy(np.asarray(seeds, dtype=np.int64))
        try:
            out = self.function(images, labels, seeds)
        except (Exception, SystemExit, KeyboardInterrupt) as error:  # a hook cannot end the process from here
            raise HookError(self.failure_words(error, _batch_words(seeds))) from error
        if (isinstance(out, tuple) and len(out) == 2 and all(isinstance(part, torch.Tensor) for part in out)
                and all(_same_kind(got, given) for got, given in zip(out, (images, labels)))):
            return out
        raise HookError(f"{self.label} returned {_what(out)} for {_batch_words(seeds)}; a batch hook returns "
                        f"(images, labels) as it is given them: images {_what(images)}, labels {_what(labels)}")

    def check_picklable(self, why: str) -> None:
        """A ConfigError naming the hook where it cannot be pickled, and `why` it must be."""
        try:
            pickle.dumps(self)
        except Exception as error:  # PicklingError, AttributeError (a local object), TypeError
            raise ConfigError(f"{self.label} cannot be pickled ({type(error).__name__}: {error_text(error)}), "
                              f"and {why}; define it at the top level of a module (not a lambda or a nested "
                              f"function), or name it in the config as 'package.module:function'") from None

    def failure_words(self, error: BaseException, where: str) -> str:
        frames = traceback.format_exception(type(error), error, error.__traceback__.tb_next)
        if isinstance(error, (SystemExit, KeyboardInterrupt)):
            how = f"called sys.exit({error.code!r})" if isinstance(error, SystemExit) else "raised KeyboardInterrupt"
            what = (f"{how} on {where}: a hook runs in the loader's workers or threads, where it cannot end the "
                    f"process; raise an exception instead")
        else:
            what = f"raised {type(error).__name__}: {error_text(error)} on {where}"
        return (f"{self.label} {what}. A hook's error stops the run (it is never taken for a bad file): fix the "
                f"hook. Its traceback:\n" + "".join(frames).rstrip())


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def fingerprint(function: Any) -> str:
    """8 hex digits that tell apart hooks their name does not: two torchvision Composes (their repr
    lists each transform and its parameters), two functools.partials of one function (its arguments),
    two lambdas or nested functions (their code and constants), a with_global_rng's transform; "" for
    a function at a module's top level, which its `module:name` says. Stable across processes and
    runs (memory addresses left out), so that a resumed run records what it saved."""
    if isinstance(function, with_global_rng):
        return fingerprint(function.transform)
    if isinstance(function, functools.partial):
        text = f"{_described(function.func)}|{function.args!r}|{sorted(function.keywords.items())!r}"
    elif inspect.isfunction(function):
        if "<" not in function.__qualname__:  # <lambda>, <locals>
            return ""
        code = function.__code__
        text = f"{function.__qualname__}|{code.co_code.hex()}|{code.co_consts!r}|{code.co_names!r}"
    elif type(function).__repr__ is not object.__repr__:
        text = repr(function)
    else:
        return ""
    return hashlib.blake2b(_ADDRESS.sub("", text).encode(), digest_size=4).hexdigest()


def _described(function: Any) -> str:
    return f"{function_name(function)}#{fingerprint(function)}"


def _same_kind(got: torch.Tensor, given: torch.Tensor) -> bool:
    return got.shape == given.shape and got.dtype == given.dtype and got.device == given.device


def _what(value: Any) -> str:
    """A value as a hook's error names it: a tensor's dtype, shape and device, else its type."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor {list(value.shape)} on {value.device}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(_what(part) for part in value[:3])})"
    return f"a {type(value).__name__}"


def _batch_words(seeds: torch.Tensor) -> str:
    return f"a batch of {len(seeds)} samples (seeds {seeds[:3].tolist()}{', ...' if len(seeds) > 3 else ''})"


def _imported_hook(spec: str, kind: str, key: str) -> Hook:
    return load_hook(spec, kind, key, key)


def load_hook(given: str | Callable, kind: str, key: str, where: str) -> Hook:
    """The hook `given` as `package.module:function` (imported now) or as a callable. A torchvision
    transform given as a sample hook takes one image and draws from the global generator: it is
    run through with_global_rng (logged)."""
    function = import_dotted(given, key, where, "the hook function") if isinstance(given, str) else given
    if not callable(function):
        raise ConfigError(f"{key}: {_what(function)} is not callable; give a function, or 'package.module:function' "
                          f"in the config (docs/transforms.md)")
    if kind == "sample_hook" and type(function).__module__.startswith("torchvision.transforms"):
        log.info("%s: %s is a torchvision transform: it runs as with_global_rng(transform), torch's global generator "
                 "seeded with each sample's seed", key, function_name(function))
        function = with_global_rng(function)
    name = given if isinstance(given, str) else function_name(given)
    if isinstance(function, with_global_rng) and not isinstance(given, with_global_rng):
        name = f"with_global_rng({name})"
    return Hook(function, kind, key, name, _version(function), spec=given if isinstance(given, str) else None)


def _version(function: Any) -> str:
    version = getattr(function, "version", None)
    return "" if version is None else str(version)


@dataclass(frozen=True)
class SplitHooks:
    """A split's hooks, each None where it has none; graph_args: dali.graph_hook_args."""
    sample: Hook | None = None
    batch: Hook | None = None
    graph: Hook | None = None
    graph_args: Mapping[str, Any] = field(default_factory=dict)

    def all(self) -> list[Hook]:
        return [hook for hook in (self.sample, self.batch, self.graph) if hook is not None]

    def state(self) -> dict[str, str]:
        """{kind: name[@version]} of each hook: what a loader's state records."""
        return {hook.kind: hook.record() for hook in self.all()}

    def check_picklable(self, why: str) -> None:
        """Where workers start by spawn (not fork), each hook they run must pickle: named if not."""
        for hook in (self.sample, self.batch):
            if hook is not None:
                hook.check_picklable(why)


def split_hooks(configured: Mapping[str, tuple[str | None, str, str]], graph_args: Mapping[str, Any],
                sample_hook: str | Callable | None = None, batch_hook: str | Callable | None = None,
                graph_hook: str | Callable | None = None) -> SplitHooks:
    """A split's hooks: those given to build_loader, else the configured ones (imported now, so that a
    path that does not import fails at load, naming its key). `configured`: {kind: (its
    'package.module:function' or None, its config key, where it was set)} (Config.hook_settings);
    `graph_args`: dali.graph_hook_args."""
    given = {"sample_hook": sample_hook, "batch_hook": batch_hook, "graph_hook": graph_hook}
    hooks = {}
    for kind in HOOK_KINDS:
        path, key, origin = configured[kind]
        if given[kind] is not None:
            hooks[kind] = load_hook(given[kind], kind, f"build_loader({kind}=...)", f"build_loader({kind}=...)")
        elif path is not None:
            hooks[kind] = load_hook(path, kind, key, origin)
    return SplitHooks(hooks.get("sample_hook"), hooks.get("batch_hook"), hooks.get("graph_hook"),
                      dict(graph_args or {}))


class with_global_rng:  # noqa: N801 - used as a function: `sample_hook=with_global_rng(transform)`
    """A sample hook that runs `transform(image)` (a torchvision.transforms.v2 Compose, say) with
    torch's, Python's and numpy's global generators seeded from the sample's generator, and puts
    them back after: its draws are the sample's, whichever process runs it. A class, so that it
    pickles where workers are spawned and into the DALI backend's hook processes.

    The global generators are the whole process's: run it only where nothing else draws meanwhile
    (a worker process; the training thread, between the trainer's draws). A thread beside the
    trainer's would reseed the trainer's generators under it, and a lock cannot stop the trainer
    drawing (issue 68): the DALI backend runs it in processes of its own (Hook.draws_globally)."""

    def __init__(self, transform: Callable):
        self.transform = transform
        self.hook_name = f"with_global_rng({function_name(transform)})"
        self.version = getattr(transform, "version", None)

    def __call__(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        seed = generator.initial_seed()
        saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
        torch.default_generator.manual_seed(seed)  # the CPU's only: CUDA's is left alone
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            return self.transform(image)
        finally:
            torch.set_rng_state(saved[0])
            random.setstate(saved[1])
            np.random.set_state(saved[2])
