"""Read and check a batch's samples in worker processes, into memory the calling process reads in place.

Why: the DALI backend's feed (dali_loader/feed.py) reads and checks every sample it hands to DALI,
and on one thread those checks hold the GIL: 30-45 us a sample taken from the thread that also runs
the pipeline, on the process the trainer runs in. Threads do not help (the checks are Python), but
processes do: here the reads and checks of a batch are split across worker processes, each sample's
bytes land in shared memory, and the caller unpacks what each sample's check found (offset, size,
format, header size, problem) for a few microseconds a sample; DALI then reads the bytes where they
lie (external_source's no_copy), so they are never copied in the caller.

The shared memory is one `Slab` a batch in flight: a memfd (Linux), which a worker maps through
/proc/<caller>/fd. Nothing is made in /dev/shm (64 MB in a Docker container by default, less than a
few batches of ImageNet), and nothing is left behind when a process is killed. Workers start from a
clean forkserver (parallel.script_safe_forkserver: the pipeline's native threads forbid a fork), never
import torch (fastloader/__init__ imports it lazily), and die with the process they work for
(parallel.die_with). Only local files and byte ranges of local containers go to the workers; a
source's samples, compressed parquet rows and object-store shards are read by the caller.

Each worker has a pipe of its own, which the calling thread writes a `Task` to and reads the
`Reply` from: no pool threads in the caller, which would take the GIL from the trainer for each
wake-up (2-5 us a sample, measured against concurrent.futures' pool). A task is a few numbers: the
share's locations are pickled into the slab where the worker then reads into, so a send never waits
on a worker that reads nothing (a pipe holds less than a batch's paths).

What each process owns: the caller owns its `SharedReads` (slabs, workers, pipes), freed by its
close(); a worker owns the slabs it has mapped (`MappedSlabs`, made by `serve` and freed when it
returns), and unmaps those the caller no longer lists. No table here is the module's.

A worker that dies or fails breaks the reads: `failure` says why, and the caller reads in its own
thread from there (the feed logs it). What a worker finds is what read_screened finds in the caller.
"""
from __future__ import annotations

import itertools
import mmap
import os
import pickle
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import exits
from ..errors import error_text
from ..imaging.jpeg_header import SAMPLINGS
from ..locations import Location, as_location
from ..parallel import die_with, how_it_ended, piped_process, script_safe_forkserver
from ..sources.reading import read_run, run_bytes, runs
from ..sources.urls import is_url
from .screen import Screened, read_screened, screen_read

SAMPLE_BYTES = 160 << 10
"""A slab's first room per sample: above an ImageNet JPEG's mean (110 KiB). A slab grows when a batch
needed more (`Slab.need`); a sample that finds no room left comes back in the worker's reply."""


def shareable() -> str | None:
    """Why reads cannot be shared with worker processes here, or None where they can."""
    if not hasattr(os, "memfd_create") or not os.path.isdir(f"/proc/{os.getpid()}/fd"):
        return "this system has no memfd_create or /proc (Linux has both)"
    return None


def worker_reads(location: Location) -> bool:
    """Whether a worker process reads this sample: a local file or a range of a local container."""
    return not location.reader and location.row < 0 and not is_url(location.file)


class Slab:
    """One batch's shared memory: a memfd of `capacity` bytes, mapped here (and in each worker that
    reads into it). Its arrays stay valid as long as they are referenced, after `close` too."""

    _numbers = itertools.count(1)

    def __init__(self, capacity: int):
        self.number = next(self._numbers)
        self.capacity = capacity
        self.fd = os.memfd_create("fastloader-feed", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.ftruncate(self.fd, capacity)
            self.array = np.frombuffer(mmap.mmap(self.fd, capacity), dtype=np.uint8)  # the mapping takes a descriptor
        except OSError:  # no memory or descriptor left: the memfd is no one's to close but ours
            os.close(self.fd)
            raise
        self.need = 0
        """The bytes the last batch read into it took, in it and beside it."""

    def close(self) -> None:
        """Its descriptor closed; its array stays readable (a batch taken from it may still be read
        on the driver thread, as after a worker died)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def let_go(self) -> None:
        """Closed, and its array let go: the mapping (which holds a descriptor of its own) goes as
        soon as no array made from it is referenced any more. Only where nothing reads it again."""
        self.close()
        self.array = None


class SlabAddress(NamedTuple):
    """Where a worker finds a slab of the caller's: the memfd `fd` of process `owner`, `capacity`
    bytes, known to the worker by `number`."""
    owner: int
    number: int
    fd: int
    capacity: int


class Task(NamedTuple):
    """A worker's share of a batch: its locations, pickled at `start` in the slab (`listed` bytes;
    or the list itself, where it did not fit), read into [start, end). `live`: the caller's slabs
    now (numbers); any other the worker mapped was replaced (grown, renewed) and is unmapped."""
    number: int
    slab: SlabAddress
    start: int
    end: int
    listed: int | list
    max_pixels: int
    live: tuple[int, ...] = ()

    def wire(self) -> tuple:
        """As it goes down the pipe: plain numbers, which pickle in a fifth of the time a named tuple
        takes (its class is looked up at each end: 5-15 us more a task, measured)."""
        return self.number, *self.slab, self.start, self.end, self.listed, self.max_pixels, self.live

    @classmethod
    def from_wire(cls, sent: tuple) -> Task:
        number, owner, slab, fd, capacity, start, end, listed, max_pixels, live = sent
        return cls(number, SlabAddress(owner, slab, fd, capacity), start, end, listed, max_pixels, live)


class Reply(NamedTuple):
    """What a worker sends back for task `number`: the share's numbers (one row a sample: the
    columns OFFSET ... SAMPLING) and odd rows (Received), or why the task failed. It goes up the
    pipe as a plain tuple (Task.wire says why), named again by `_make`."""
    number: int
    numbers: np.ndarray | None
    odd: dict | None
    failure: str | None = None


class WorkerFailed(Exception):
    """A worker process ended, or failed outside the reads: its words."""


class _Worker:
    """A worker process and this end of its pipe. Tasks go down the pipe (a few numbers: the
    locations lie in the slab, so a send never waits on a worker that does not read), and replies
    come back in the tasks' order; a reply read while waiting for another one is kept."""

    def __init__(self, context, owner: int):
        self.conn, self.process = piped_process(context, serve, (owner,), "fastloader-feed-reads")
        self.replies: dict[int, Reply] = {}
        self.outstanding: set[int] = set()
        """The tasks sent whose replies have not come back yet."""

    def send(self, task: Task) -> None:
        self.conn.send(task.wire())
        self.outstanding.add(task.number)

    def reply(self, number: int, deadline: float | None = None) -> Reply:
        """Task `number`'s reply. TimeoutError past `deadline` (monotonic); WorkerFailed where the
        worker ended or the task failed."""
        self.arrived(number, deadline)
        reply = self.replies.pop(number)
        if reply.failure is not None:
            raise WorkerFailed(reply.failure)
        return reply

    def forget(self, number: int, deadline: float | None = None) -> None:
        """Until task `number` has ended, its reply dropped (taken already, or not wanted)."""
        self.arrived(number, deadline)
        self.replies.pop(number, None)

    def arrived(self, number: int, deadline: float | None = None) -> None:
        """Until task `number`'s reply is here (kept for `reply`), as `reply` says."""
        while number in self.outstanding:
            if deadline is not None and not self.conn.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError
            try:
                reply = Reply._make(self.conn.recv())
            except (EOFError, OSError) as error:
                raise WorkerFailed(self.ended()) from error
            self.outstanding.discard(reply.number)
            self.replies[reply.number] = reply

    def ended(self) -> str:
        """How the process ended, in words: its signal or exit code."""
        return f"the feed's worker process {self.process.pid} ended ({how_it_ended(self.process)})"

    def let_go(self) -> None:
        """This end of the pipe closed and the ended process reaped, with its descriptors; only where
        no thread reads the pipe any more (a read under way would find its descriptor reused)."""
        self.conn.close()
        self.process.join(1.0)  # killed: it ends at once, unless the kernel finishes a read first
        if self.process.exitcode is not None:
            self.process.close()


@dataclass(eq=False)
class Pending:
    """A batch's reads sent to the workers: its slab, each worker's share (the worker, the task's
    number), the locations."""
    slab: Slab
    shares: list[tuple[_Worker, int]]
    locations: list[Location]


Read = tuple[np.ndarray | None, Screened]
"""What read_screened gives: the bytes (None where they could not be read) and their check."""

OFFSET, LENGTH, WIDTH, HEIGHT, TURNED, CODING, SAMPLING = range(7)
"""The columns of a reply's numbers: where a sample's bytes lie in the slab (-1: not there), how many,
its header's size and EXIF turn (-1 where the check found no size), a JPEG's frame marker
(Screened.coding) and chroma subsampling (Screened.sampling, by its place in jpeg_header.SAMPLINGS)."""


class Received(NamedTuple):
    """A batch's reads, as the workers replied: one row of numbers a sample, and `odd`, by row, what
    a plain JPEG read into the slab does not have: (bytes that found no room there, format, problem).
    A batch without odd rows is unpacked by whole columns (the DALI feed's common case)."""
    numbers: np.ndarray
    odd: dict[int, tuple[bytes | None, str | None, str | None]]
    locations: list[Location]
    slab: Slab

    def arrays(self) -> list[np.ndarray]:
        """Each sample's bytes, where they lie in the slab (a batch without odd rows)."""
        memory = self.slab.array
        return [memory[offset:offset + length] for offset, length in self.numbers[:, :2].tolist()]

    def reads(self) -> list[Read]:
        """Each sample's bytes and check, as read_screened gives them."""
        reads = []
        for row, (offset, length, width, height, turned, coding, sampling) in enumerate(self.numbers.tolist()):
            inline, fmt, problem = self.odd.get(row, (None, "JPEG", None))
            if inline is not None:
                data = np.frombuffer(inline, dtype=np.uint8)
            else:
                data = None if offset < 0 else self.slab.array[offset:offset + length]
            size = (None, None) if width < 0 else (width, height)
            reads.append((data, Screened(self.locations[row].name, fmt, *size, problem, turned > 0,
                                         coding=max(coding, 0), sampling=SAMPLINGS[max(sampling, 0)])))
        return reads


class SharedReads:
    """Batches read and checked by `processes` worker processes into `slabs` slabs that the caller
    takes back (`release`) when DALI is done with a batch. Called from one thread (the feed's)."""

    def __init__(self, processes: int, slabs: int, batch_size: int, max_pixels: int, timeout_s: float = 120.0):
        self.processes, self.max_pixels = processes, max_pixels
        self.timeout_s = timeout_s
        """The longest wait for reads no longer wanted (workers.timeout): a worker stuck longer is killed."""
        self.capacity = batch_size * SAMPLE_BYTES
        self.slabs: list[Slab] = []
        try:
            for _ in range(slabs):
                self.slabs.append(Slab(self.capacity))
        except OSError:  # no memory or descriptor left: none kept open
            for slab in self.slabs:
                slab.close()
            raise
        self.free = list(self.slabs)
        self.pending: set[Pending] = set()
        self.workers: list[_Worker] = []
        self.tasks = itertools.count()
        self.owner = os.getpid()
        """The process the workers work for: only it stops them."""
        self.failure: str | None = None
        """Why the workers read no more (the caller reads from then on); None while they do."""

    @property
    def pids(self) -> list[int]:
        return sorted(worker.process.pid for worker in self.workers)

    def start(self) -> None:
        """Start the workers now (their 0.3 s of imports run in the background), so that they are
        ready when the first batch is sent rather than delay it. OSError where they cannot start."""
        if not self.workers and self.failure is None:
            context = script_safe_forkserver()
            try:
                for _ in range(self.processes):
                    self.workers.append(_Worker(context, self.owner))
            except BaseException:
                self.stop_workers()
                raise
            exits.stop_at_exit(self, SharedReads.stop_workers)  # before multiprocessing joins every child

    def submit(self, locations: list[Location]) -> Pending | None:
        """These locations sent to the workers, a contiguous share each; None where they cannot take
        them (they failed, or no slab is free)."""
        if self.failure is not None or not self.free or not locations:
            return None
        slab = None
        try:
            slab = self._grown(self.free.pop())
            self.start()
        except OSError as error:  # no memory or descriptor left for a larger slab, or the workers' pipes
            self.fail(error)
            if slab is not None:
                self.release(slab)
            return None
        share = -(-len(locations) // self.processes)
        room = slab.capacity // len(locations)
        sent = [location.file if location.whole_file and location.name == location.file else tuple(location)
                for location in locations]  # a path pickles in a thirtieth of a Location's time, a tuple in a quarter
        shares = []
        live = tuple(mine.number for mine in self.slabs)  # the worker unmaps the slabs replaced since
        address = SlabAddress(self.owner, slab.number, slab.fd, slab.capacity)
        try:
            for worker, first in zip(self.workers, range(0, len(locations), share)):
                part = sent[first:first + share]
                start, end = first * room, (first + len(part)) * room
                listed = pickle.dumps(part, pickle.HIGHEST_PROTOCOL)
                if len(listed) <= end - start:  # the list where the worker reads into: a send of a few numbers
                    slab.array[start:start + len(listed)] = np.frombuffer(listed, dtype=np.uint8)
                    part = len(listed)
                task = Task(next(self.tasks), address, start, end, part, self.max_pixels, live)
                worker.send(task)
                shares.append((worker, task.number))
        except (OSError, ValueError):  # the worker's end of the pipe closed: it died
            self.fail(WorkerFailed(worker.ended()))
            self._wait(shares)
            self.release(slab)
            return None
        pending = Pending(slab, shares, locations)
        self.pending.add(pending)
        return pending

    def take(self, pending: Pending) -> Received | None:
        """The reads of a batch sent, in order; None where the workers failed (`failure` says why)."""
        self.pending.discard(pending)
        try:
            replies = [worker.reply(number) for worker, number in pending.shares]
        except WorkerFailed as error:  # a worker died, or failed outside the reads
            self.fail(error)
            self._wait(pending.shares)
            self.release(pending.slab)
            return None
        numbers = np.concatenate([reply.numbers for reply in replies]) if len(replies) > 1 else replies[0].numbers
        odd, first = {}, 0
        for reply in replies:
            odd.update((first + row, found) for row, found in reply.odd.items())
            first += len(reply.numbers)
        pending.slab.need = int(numbers[:, LENGTH].sum())
        return Received(numbers, odd, pending.locations, pending.slab)

    def drop(self, pending: Pending) -> None:
        """A batch sent and no longer wanted (an epoch left early): its slab back once its reads end."""
        self.pending.discard(pending)
        self._wait(pending.shares)
        self.release(pending.slab)

    def release(self, slab: Slab) -> None:
        """A slab whose batch DALI is done with, back to be read into (one of `renew`'s old ones is not)."""
        if any(slab is mine for mine in self.slabs):
            self.free.append(slab)

    def renew(self) -> None:
        """New slabs for the next batches: after a pipeline failed, the memory it was given is left to
        it, whatever of it DALI's threads may still read while it is torn down."""
        for pending in list(self.pending):
            self.drop(pending)
        for slab in self.slabs:
            slab.close()
        self.slabs = [Slab(self.capacity) for _ in self.slabs]
        self.free = list(self.slabs)

    def fail(self, error: BaseException) -> None:
        if self.failure is None:
            words = f"{type(error).__name__}: {error_text(error)}"
            self.failure = str(error) if isinstance(error, WorkerFailed) else words

    def stop_workers(self) -> None:
        """Kill the workers: one stuck in a read must hold up neither a wait nor the process's exit.
        Their pipes close when nothing holds them (a thread may be reading one now). A forked copy
        of the process that started them (a child exiting, its finalizers) leaves them alone."""
        workers, self.workers = self.workers, []
        if os.getpid() != self.owner:
            return
        for worker in workers:
            if worker.process.exitcode is None:
                worker.process.kill()

    def close(self, settled: bool = False) -> None:
        """Stop the workers and close the slabs (their arrays stay valid while referenced).
        `settled`: nothing calls this object any more and no other thread is in a call of it now
        (the loader closed, its driver thread ended), so the workers' pipes are closed and the
        processes reaped here, not when this object is collected (a closed loader that is kept would
        hold their descriptors); else a read under way would find its descriptor reused."""
        workers = list(self.workers)
        self.stop_workers()
        exits.forget(self)
        if settled and os.getpid() == self.owner:
            for worker in workers:
                worker.let_go()
        for slab in self.slabs:
            if settled:
                slab.let_go()
            else:
                slab.close()
        self.slabs, self.free, self.pending = [], [], set()

    def _grown(self, slab: Slab) -> Slab:
        """The slab, or a larger one in its place where its last batch needed more room than it had."""
        if slab.need <= slab.capacity:
            return slab
        self.capacity = max(self.capacity, -(-slab.need * 5 // 4 // mmap.PAGESIZE) * mmap.PAGESIZE)
        try:
            larger = Slab(self.capacity)
        except OSError:
            self.free.append(slab)
            raise
        slab.close()
        self.slabs = [larger if mine is slab else mine for mine in self.slabs]
        return larger

    def _wait(self, shares: list[tuple[_Worker, int]]) -> None:
        """Until these reads have ended (their slab is then written no more); a worker that takes
        longer than `timeout_s` is killed, and with it the reads."""
        deadline = time.monotonic() + self.timeout_s
        for worker, number in shares:
            try:
                worker.forget(number, deadline)
            except TimeoutError:
                self.fail(TimeoutError(f"a worker read for more than {self.timeout_s:g} s (workers.timeout)"))
                stuck = [worker for worker, _ in shares]
                self.stop_workers()
                for worker in stuck:  # killed: ended at once, unless inside a read the kernel finishes first
                    worker.process.join(self.timeout_s)
                return
            except WorkerFailed:  # ended: it writes no more
                pass


# In a worker process


def serve(conn, owner: int) -> None:
    """A worker's life: each task's share read and checked (`read_task`), the reply sent, until the
    caller's end of the pipe closes. It dies with `owner` (parallel.die_with). The slabs it maps are
    its own (`mapped`), unmapped when it returns."""
    die_with(owner, forked_by_main_thread=False)
    mapped = MappedSlabs()
    while True:
        try:
            task = Task.from_wire(conn.recv())
        except (EOFError, OSError):
            return
        try:
            reply = Reply(task.number, *read_task(task, mapped))
        except Exception as error:  # noqa: BLE001 - said to the caller, which then reads itself
            reply = Reply(task.number, None, None, f"the feed's worker process {os.getpid()} failed: "
                                                   f"{type(error).__name__}: {error_text(error)}")
        conn.send(tuple(reply))


def read_task(task: Task, mapped: MappedSlabs) -> tuple[np.ndarray, dict]:
    """A task's share read (`read_share`): its locations taken from the slab (or the task), and the
    slabs the caller replaced since unmapped first."""
    mapped.keep_only(task.live, task.slab.number)
    listed = task.listed
    if isinstance(listed, int):
        listed = pickle.loads(mapped.memory(task.slab)[task.start:task.start + listed])
    locations = [item if isinstance(item, str) else Location._make(item) for item in listed]
    return read_share(task.slab, task.start, task.end, locations, task.max_pixels, mapped)


class MappedSlabs:
    """The caller's slabs a worker has mapped, by number: what `serve` owns while it runs (each
    worker process its own), so that a task into a slab already mapped maps nothing again."""

    def __init__(self):
        self.by_number: dict[int, mmap.mmap] = {}

    def memory(self, slab: SlabAddress) -> mmap.mmap:
        """The slab mapped here, through /proc/<owner>/fd (mapped at its first task)."""
        memory = self.by_number.get(slab.number)
        if memory is None:
            handle = os.open(f"/proc/{slab.owner}/fd/{slab.fd}", os.O_RDWR)
            try:
                memory = mmap.mmap(handle, slab.capacity)
            finally:
                os.close(handle)
            self.by_number[slab.number] = memory
        return memory

    def keep_only(self, live: tuple[int, ...], number: int) -> None:
        """The slabs that are neither `live` nor `number` unmapped (once no view of them is left:
        none outlives a task)."""
        for old in [mapped for mapped in self.by_number if mapped not in live and mapped != number]:
            del self.by_number[old]


def read_share(slab: SlabAddress, start: int, end: int, locations: list[Location | str], max_pixels: int,
               mapped: MappedSlabs) -> tuple[np.ndarray, dict]:
    """In a worker: read_screened of each location into bytes [start, end) of the caller's slab
    (mapped through `mapped`); the reply's numbers (Received) and its odd rows: a problem, a format
    other than JPEG, or bytes that found no room in the slab (or grew while read), which come back in
    the reply. Ranges that lie side by side in a container (reading.runs) are read together, with
    what lies between them."""
    arena = _SlabArena(mapped.memory(slab), start, end)
    numbers = np.full((len(locations), SAMPLING + 1), -1, dtype=np.int64)
    odd = {}
    locations = [as_location(location) for location in locations]
    for begin, stop in runs(locations):
        run = locations[begin:stop]
        offsets, size = [-1] * len(run), run_bytes(run)
        if len(run) > 1 and arena.offset + size <= arena.end:  # one read, in the slab
            span = arena.view(size)
            span_at, offsets = arena.given, read_run(run, span)
        for row, offset in zip(range(begin, stop), offsets):
            if offset >= 0:  # as read_screened would have read it
                data = span[offset:offset + locations[row].length]
                _note(numbers, odd, row, data, screen_read(locations[row].name, data, max_pixels),
                      span_at + offset, arena)
            else:  # read alone, which says why where it fails
                data, screened = read_screened(locations[row], max_pixels, arena)
                _note(numbers, odd, row, data, screened, arena.given, arena)
    return numbers, odd


def _note(numbers: np.ndarray, odd: dict, row: int, data, screened: Screened, offset: int, arena: _SlabArena) -> None:
    """A sample's read in the reply: its numbers, or an odd row (a problem, a format other than
    JPEG, bytes that are not in the slab)."""
    inline = None
    if data is not None and screened.problem is None:
        numbers[row, LENGTH] = len(data)
        if isinstance(data, memoryview) and data.obj is arena.memory:
            numbers[row, OFFSET] = offset  # read_bytes returns the first bytes of the view it got
        else:  # no room left, or a file that grew while it was read
            inline = bytes(data)
    else:
        numbers[row, LENGTH] = 0
    if screened.width is not None:
        numbers[row, WIDTH:] = (screened.width, screened.height, screened.turned, screened.coding,
                                SAMPLINGS.index(screened.sampling))
    if inline is not None or screened.problem is not None or screened.format != "JPEG":
        odd[row] = inline, screened.format, screened.problem


class _SlabArena:
    """read_bytes' arena (locations.ReadArena's `view`) over bytes [start, end) of a slab: a
    read that finds no room left gets memory of its own, returned to the caller inline."""

    def __init__(self, memory: mmap.mmap, start: int, end: int):
        self.memory, self.start, self.end = memory, start, end
        self.whole = memoryview(memory)
        self.offset = start
        self.given = -1
        """Where the last view given starts in the slab."""

    def view(self, size: int) -> memoryview:
        if self.offset + size > self.end:
            return memoryview(bytearray(size))
        self.given, self.offset = self.offset, self.offset + size
        return self.whole[self.given:self.offset]

    def reset(self) -> None:
        self.offset = self.start
