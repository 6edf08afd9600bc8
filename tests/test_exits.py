"""fastloader/exits.py, the one exit hook for what loaders start: in a real interpreter that exits,
every owner still registered is stopped, then waited for within one shared deadline; an owner that
closed (forget) or was dropped is left alone; the hook runs before multiprocessing's. CPU only."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO

SCRIPT = """
import atexit, multiprocessing.util, time
from fastloader import exits

class Owner:
    def __init__(self, name):
        self.name = name

def stop(owner):
    print("stop", owner.name, flush=True)

def wait(owner, seconds):
    print("wait", owner.name, round(seconds, 1), flush=True)
    time.sleep(seconds)  # a thread that never returns: each later owner gets what is left

kept = [Owner("first"), Owner("second"), Owner("closed")]
for owner in kept:
    exits.stop_at_exit(owner, stop, wait)
exits.forget(kept[2])
dropped = Owner("dropped")
exits.stop_at_exit(dropped, stop, wait)
del dropped
atexit.register(lambda: print("a later hook of the user's", flush=True))
exits.stop_at_exit(kept[0], stop, wait)  # started again: registered again, so it runs first
"""


def test_owners_still_registered_are_stopped_then_waited_for_within_one_deadline():
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["stop first", "stop second"]
    assert lines[2].startswith("wait first ") and float(lines[2].split()[-1]) >= 0.8
    assert lines[3] == "wait second 0.0"  # one WAIT_S for both: the first's wait spent it
    assert lines[4:] == ["a later hook of the user's"]  # ours ran first: it was registered last
