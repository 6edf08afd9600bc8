"""What the DALI loader does when something fails: one table of cases, read top down.

DALI ends an epoch, or fails, on its driver thread (driver.py), which hands the loop an `Ended`;
whether a file can be to blame decides everything that follows. `case_of` gives the first row of
CASES that applies; the loop (loader.py `_iter_batches`) does what its `then` says:

| when the driver ends ...                                | then                                     |
|---------------------------------------------------------|------------------------------------------|
| the loader was closed meanwhile (a thread, a finalizer) | CLOSED: the closed loader's LoaderError  |
| without an error: the feed ran out of batches           | END of the epoch                         |
| an operator after the user's graph function failed, and | STOP, raising a HookError that says what |
|   nothing else is known to have: no decoder, no memory, |   a graph function returns, DALI's words |
|   no sample hook, source or store                       |                                          |
| not an operator's failure on a file: the set-up, the    | STOP, raising that error as it is (out   |
|   hand-over or the finisher failed, memory ran out, a   |   of memory: with what to lower)         |
|   store or connection failed, an interrupt              |                                          |
| with the user's sample hook's error kept                | STOP, raising the HookError, from DALI's |
| with the reader's finding that the source changed       | STOP, raising that SourceError           |
| otherwise: an operator failed, maybe on a file          | PROBE (recovery.py), which then says:    |
|   - the probe itself failed (out of memory)             |   STOP, raising the probe's error        |
|   - no file fails, in its batch or alone                |   STOP, LoaderError: the batch's first   |
|                                                         |   files and DALI's reason                |
|   - files fail, dataset.on_bad_image: raise             |   STOP, BadImageError naming the first   |
|   - files fail, dataset.on_bad_image: skip              |   REBUILD without them (left out for the |
|                                                         |   run), feeding the unfinished batches   |

Besides the driver's end (loader.py): a sample the feed left out (a read or a check found it
unusable) is skipped (listed in bad_samples, its slot refilled in train) or, under
dataset.on_bad_image: raise, STOPs with a BadImageError naming it; a loop that finds the loader
stopped, or built in another process, raises a LoaderError saying so and what to do; a loop whose
pipeline a newer loop took over raises the superseded error. Nothing is retried blindly: a DALI
pipeline cannot go on after an error, so going on means a new one. STOP ends the loader for good
(recovery.Recovery.stop): its pipeline is let go and later loops are refused with why.
"""
from __future__ import annotations

import enum
from typing import Callable, NamedTuple

import torch

from fastloader.errors import NOT_A_SAMPLES_FAULT, HookError
from fastloader.hooks import Hook

from .probe import dali_reason, out_of_memory


class Then(enum.Enum):
    """What the loop does in a case."""
    CLOSED = "raise the closed loader's error"
    END = "end the epoch"
    STOP = "stop the loader for good, raising the case's error"
    PROBE = "find the files that broke the pipeline, then rebuild without them or stop naming them"


class Ending(NamedTuple):
    """What the loop knows as the driver ends."""
    error: BaseException | None
    """The driver's error (driver.Ended); None at the epoch's end."""
    in_pipeline: bool
    """The error came out of DALI's run (an operator, or the feed DALI calls): only such can be a file's."""
    closed: bool
    """The loader was closed meanwhile."""
    graph_hook: Hook | None
    """The user's graph function, where the graph has one."""
    hook_failure: BaseException | None
    """The user's sample hook's error, kept where it raised on a DALI thread."""
    source_failure: BaseException | None
    """The reader's finding that the source changed since it was indexed."""


def _graph_function_to_blame(ending: Ending) -> bool:
    """An operator after the user's graph function failed (DALI says so with a RuntimeError or a
    ValueError): what it returned is what DALI could not use (the seeds' DataNode, one channel for
    three), never a file's fault. Not where something else is known to have failed, which DALI
    reports as an operator's failure too: a decoder (a file's, the probe finds it), memory (nobody's),
    the sample hook, the source, a store (no sample's); nor an interrupt."""
    error = ending.error
    return (ending.in_pipeline and ending.graph_hook is not None and isinstance(error, Exception)
            and not isinstance(error, NOT_A_SAMPLES_FAULT) and ending.hook_failure is None
            and ending.source_failure is None and "decoders" not in dali_reason(error) and not out_of_memory(error))


def _graph_function_error(ending: Ending) -> HookError:
    """The graph function's error, with what is expected and DALI's words; raised from nothing."""
    reason = dali_reason(ending.error) if isinstance(ending.error, Exception) else ""
    error = HookError(f"{ending.graph_hook.label} returned a DataNode the rest of the graph cannot take as the "
                      f"images: a graph function returns its images' DataNode changed, HWC uint8 of 3 channels and "
                      f"the size it is given (called as function(images, seeds, **dali.graph_hook_args); the seeds "
                      f"are no images). DALI says: {reason[:800]}")
    return _raised_from(error, None)


def _no_file_to_blame(ending: Ending) -> bool:
    """Not an operator's RuntimeError on a file: the set-up, the hand-over to torch or the finisher
    failed, memory ran out, or a store or connection failed (errors.NOT_A_SAMPLES_FAULT)."""
    error = ending.error
    return not (ending.in_pipeline and isinstance(error, RuntimeError) and not out_of_memory(error)
                and not isinstance(error, NOT_A_SAMPLES_FAULT))


def _raised_from(error: BaseException, cause: BaseException | None) -> BaseException:
    """`error` as `raise error from cause` raises it (`cause` None: `from None`)."""
    error.__cause__, error.__suppress_context__ = cause, True
    return error


class Case(NamedTuple):
    when: str
    applies: Callable[[Ending], bool]
    then: Then
    raised: Callable[[Ending], BaseException] | None = None
    """STOP: the error the trainer gets."""


CASES: tuple[Case, ...] = (
    Case("the loader was closed meanwhile (from another thread, or a finalizer on the driver's)",
         lambda ending: ending.closed, Then.CLOSED),
    Case("the feed ran out of batches", lambda ending: ending.error is None, Then.END),
    Case("an operator after the user's graph function failed", _graph_function_to_blame, Then.STOP,
         _graph_function_error),
    Case("no file is to blame", _no_file_to_blame, Then.STOP, lambda ending: ending.error),
    Case("the user's sample hook raised on a DALI thread", lambda ending: ending.hook_failure is not None,
         Then.STOP, lambda ending: _raised_from(ending.hook_failure, ending.error)),
    Case("the source changed since it was indexed", lambda ending: ending.source_failure is not None,
         Then.STOP, lambda ending: _raised_from(ending.source_failure, ending.error)),
    Case("an operator failed, maybe on a file", lambda ending: True, Then.PROBE),
)


def case_of(ending: Ending) -> Case:
    """The first case of CASES that applies."""
    return next(case for case in CASES if case.applies(ending))


def stopped_words(split_name: str, error: BaseException) -> str:
    """Why a stopped loader refuses later loops."""
    return (f"the DALI loader of split '{split_name}' stopped on {type(error).__name__}: {str(error)[:500]}; "
            f"build a new loader")


def memory_hint(device: torch.device, split_name: str, batch_size: int, threads: int, source: str) -> str:
    """What to lower when a batch does not fit, with the device's memory where it can be read."""
    figures = ""
    if device.type == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
            held = torch.cuda.memory_reserved(device)
            figures = (f" ({free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB on {device}, "
                       f"{held / 2**30:.1f} GiB of it held by torch)")
        except Exception:  # noqa: BLE001 - the figures are a courtesy; a broken context may not give them
            pass
    return (f"fastloader: the DALI loader of split '{split_name}' ran out of memory{figures}. Lower "
            f"{split_name}.batch_size (now {batch_size}) or dali.threads (now {threads}; on the GPU each DALI "
            f"thread keeps nvJPEG buffers of its own) in {source}")
