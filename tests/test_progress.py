"""Progress of long work: a tqdm bar on a terminal, a line every ~10% elsewhere, always on stderr."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import sys
import termios

from fastloader.progress import Progress


def test_off_a_terminal_it_writes_a_line_per_tenth_and_the_last_one(capsys):
    progress = Progress(105, unit="files")
    for done in range(1, 106):
        progress.update(done)
    progress.finish()
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == ""
    assert all(re.fullmatch(r"\d+/105 files \(\d+%\)", line) for line in lines), lines
    counts = [int(line.split("/")[0]) for line in lines]
    assert counts[-1] == 105 and len(lines) == 10  # 11, 22, ... 99, then the end: no line twice
    assert all(later - earlier >= 10 for earlier, later in zip(counts, counts[1:-1]))


def test_off_a_terminal_steps_of_many_items_each_get_their_line(capsys):
    progress = Progress(240, unit="files")
    for done in (64, 128, 192, 240):  # screening's chunks
        progress.update(done)
    progress.finish()
    assert capsys.readouterr().err.splitlines() == ["64/240 files (27%)", "128/240 files (53%)",
                                                    "192/240 files (80%)", "240/240 files (100%)"]


def test_advance_counts_steps(capsys):
    progress = Progress(3, unit="rounds")
    for _ in range(3):
        progress.advance()
    progress.finish()
    assert progress.done == 3
    assert capsys.readouterr().err.splitlines() == ["1/3 rounds (33%)", "2/3 rounds (67%)", "3/3 rounds (100%)"]


def read_all(leader: int) -> bytes:
    """What was written to the pseudo-terminal (its other end closed), however many reads it takes."""
    drawn = b""
    try:
        while chunk := os.read(leader, 65536):
            drawn += chunk
    except OSError:  # EIO: nothing more, the writer's end is closed
        pass
    os.close(leader)
    return drawn


def test_on_a_terminal_it_draws_one_bar_rewritten_in_place(monkeypatch):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    terminal = os.fdopen(follower, "w")
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = Progress(240, unit="files")
    for done in (64, 128, 192, 240):
        progress.update(done)
    progress.finish()
    terminal.close()
    drawn = read_all(leader).decode()
    assert "\r" in drawn and "100%|" in drawn and "240/240" in drawn and "files/s" in drawn
    assert drawn.rstrip("\r\n").count("\n") == 0  # redrawn in place: one line, ended when finished
