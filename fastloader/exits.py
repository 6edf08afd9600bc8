"""What a loader starts that must stop before the interpreter exits (persistent DataLoader workers,
a DALI driver thread, the DALI feed's read workers), stopped by one exit hook.

Each owner registers itself when it starts such a thing (`stop_at_exit`) and leaves when it closes
(`forget`); the hook holds it weakly, so a loader dropped without closing costs nothing at exit. At
exit every owner is told to stop first, then those that must be waited for get one shared
deadline, so that N stuck threads cost WAIT_S in all, not N times it.

Why registered again at every start: atexit runs the last hook registered first, and this one must
run before multiprocessing's (which joins every child it started, and a stopped one never ends)
and DALI's (which shuts down pipelines whose threads may be stuck in the user's code).
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any, Callable

WAIT_S = 1.0
"""The longest the exit hook waits, for all owners together, for what they stopped to end."""

_owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""owner -> (stop(owner), wait(owner, seconds) or None), for every owner started and not closed."""
_lock = threading.Lock()


def stop_at_exit(owner: Any, stop: Callable[[Any], None],
                 wait: Callable[[Any, float], None] | None = None) -> None:
    """At exit, unless `forget(owner)` came first: `stop(owner)`, then `wait(owner, seconds left)`."""
    with _lock:
        _owners[owner] = (stop, wait)
    atexit.unregister(_stop_all)
    atexit.register(_stop_all)


def forget(owner: Any) -> None:
    """The owner closed what it started: nothing to do for it at exit."""
    with _lock:
        _owners.pop(owner, None)


def _stop_all() -> None:
    with _lock:
        owners = list(_owners.items())  # strong references while they stop
    for owner, (stop, _) in owners:
        try:
            stop(owner)
        except Exception as error:  # noqa: BLE001 - the others still stop; the process is ending anyway
            logging.getLogger("fastloader").warning("stopping %r at exit failed: %s", owner, error)
    deadline = time.monotonic() + WAIT_S
    for owner, (_, wait) in owners:
        if wait is not None:
            wait(owner, max(0.0, deadline - time.monotonic()))
