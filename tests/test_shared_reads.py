"""Reads and checks in worker processes, handed back in shared memory (fastloader/decoding/shared_reads.py).

Device: CPU (the DALI feed's worker processes read files; they never touch a GPU). Real files, a
real tar shard, real worker processes."""
from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import processes_end
from PIL import Image

from fastloader.decoding import shared_reads
from fastloader.decoding.screen import read_screened
from fastloader.decoding.shared_reads import SharedReads, shareable, worker_reads
from fastloader.imaging.jpeg_header import SAMPLINGS
from fastloader.locations import TAR_BLOCK, Identity, Location, header_digest
from fastloader.sources import reading

pytestmark = [pytest.mark.skipif(shareable() is not None, reason="memfd and /proc: Linux"),
              pytest.mark.timeout(120)]


def _jpeg(colour, size=(64, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="JPEG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Location]:
    """Good files, a shard's members, and files every check refuses."""
    root = tmp_path_factory.mktemp("reads")
    locations = []
    for number in range(5):
        path = root / f"good{number}.JPEG"
        path.write_bytes(_jpeg((40 * number, 90, 200), (64 + number, 48)))
        locations.append(Location(str(path), str(path)))
    png = root / "image.png"
    Image.new("RGB", (30, 20), (1, 2, 3)).save(png)
    locations.append(Location(str(png), str(png)))
    shard = root / "shard.tar"
    with tarfile.open(shard, "w") as archive:
        for number in range(3):
            data = _jpeg((10, 20 * number, 30), (40, 30 + number))
            info = tarfile.TarInfo(f"member{number}.jpg")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with tarfile.open(shard) as archive:
        for member in archive.getmembers():
            locations.append(Location(f"{shard}:{member.name}", str(shard), member.offset_data, member.size))
    (root / "cut.JPEG").write_bytes(_jpeg((5, 5, 5), (256, 192))[:300])
    (root / "text.JPEG").write_bytes(b"<html>404</html>")
    locations += [Location(str(root / name), str(root / name)) for name in ("cut.JPEG", "text.JPEG", "gone.JPEG")]
    return locations


def _same_as_here(reads, locations) -> None:
    """Each worker's read is read_screened's in this process: the bytes and the whole check."""
    assert len(reads) == len(locations)
    for (data, screened), location in zip(reads, locations):
        here, expected = read_screened(location)
        assert screened == expected, location.name
        assert (screened.coding, screened.sampling, screened.warning) == (expected.coding, expected.sampling, None), \
            location.name  # not compared by ==
        if expected.format == "JPEG" and expected.problem is None:
            assert (expected.coding, expected.sampling) == (0xC0, "4:2:0"), location.name  # the JPEGs written here
        if expected.problem is None:
            assert isinstance(data, np.ndarray) and data.tobytes() == bytes(here), location.name


def test_workers_read_and_check_as_this_process_does_into_shared_memory(files):
    reads = SharedReads(processes=2, slabs=2, batch_size=len(files), max_pixels=10**8)
    try:
        pending = reads.submit(files)
        received = reads.take(pending)
        got = received.reads()
        _same_as_here(got, files)
        names = [location.name.rsplit("/", 1)[-1] for location in files]
        assert sorted(names[row] for row in received.odd) == ["cut.JPEG", "gone.JPEG", "image.png", "text.JPEG"]
        plain = reads.take(reads.submit(files[:5] + files[6:9]))  # JPEG files and members: unpacked by columns
        assert plain.odd == {} and [array.tobytes() for array in plain.arrays()] == [
            bytes(read_screened(location)[0]) for location in files[:5] + files[6:9]]
        reads.release(plain.slab)
        problems = {screened.path.rsplit("/", 1)[-1]: screened.problem for _, screened in got if screened.problem}
        assert set(problems) == {"cut.JPEG", "text.JPEG", "gone.JPEG"}
        base = pending.slab.array.ctypes.data  # the bytes lie in the slab: no copy came back
        for data, screened in got:
            if screened.problem is None:
                assert base <= data.ctypes.data < base + pending.slab.capacity
        assert len(reads.free) == 1 and len(reads.pending) == 0  # the slab stays taken until released
        assert reads.submit(files) is not None and reads.submit(files) is None  # no slab free: the caller reads
        assert len(reads.pids) == 2
    finally:
        reads.close()


def test_a_sample_with_no_room_left_comes_back_in_the_reply_and_the_slab_grows(files):
    """A batch whose bytes outgrow its slab loses nothing: what found no room comes back in the
    worker's reply; the slab is larger when it is next read into."""
    reads = SharedReads(processes=1, slabs=1, batch_size=1, max_pixels=10**8)
    reads.capacity = len(_jpeg((0, 90, 200), (64, 48))) + 200  # room for the first file, not the second
    reads.renew()
    try:
        small = reads.slabs[0].capacity
        pending = reads.submit(files[:5])
        got = reads.take(pending).reads()
        _same_as_here(got, files[:5])
        base = pending.slab.array.ctypes.data
        outside = [data for data, _ in got if not base <= data.ctypes.data < base + small]
        assert outside and len(outside) < 5, ([d.ctypes.data - base for d, _ in got], small)
        reads.release(pending.slab)
        again = reads.submit(files[:5])
        assert again.slab.capacity >= sum(len(data) for data, _ in got) > small
        grown = reads.take(again).reads()
        _same_as_here(grown, files[:5])
        base = again.slab.array.ctypes.data
        assert all(base <= data.ctypes.data < base + again.slab.capacity for data, _ in grown)
        assert got[0][0].tobytes() == grown[0][0].tobytes()  # the old slab's arrays stay valid
    finally:
        reads.close()


def test_renewed_slabs_are_new_memory_and_the_old_ones_are_never_read_into_again(files):
    reads = SharedReads(processes=1, slabs=2, batch_size=len(files), max_pixels=10**8)
    try:
        kept = reads.take(reads.submit(files)).reads()
        old = list(reads.slabs)
        reads.submit(files)  # under way while the slabs are renewed: waited for
        reads.renew()
        assert not {id(slab) for slab in old} & {id(slab) for slab in reads.slabs} and len(reads.free) == 2
        for slab in old:
            reads.release(slab)
        assert len(reads.free) == 2
        first = [data.tobytes() for data, screened in kept if screened.problem is None]
        _same_as_here(reads.take(reads.submit(files)).reads(), files)
        assert [data.tobytes() for data, screened in kept if screened.problem is None] == first
    finally:
        reads.close()


def test_a_killed_worker_is_reported_and_the_workers_import_no_torch(files):
    reads = SharedReads(processes=2, slabs=3, batch_size=len(files), max_pixels=10**8)
    try:
        reads.take(reads.submit(files))
        for pid in reads.pids:  # torch imported would map its library
            assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text()
        killed = reads.pids[0]
        os.kill(killed, signal.SIGKILL)
        for _ in range(100):  # its pipe closes as it dies; until a batch goes to it, what the other reads is right
            pending = reads.submit(files)
            got = None if pending is None else reads.take(pending)
            if got is None:
                break
            _same_as_here(got.reads(), files)
            reads.release(pending.slab)
            time.sleep(0.05)
        assert reads.failure == f"the feed's worker process {killed} ended (killed by SIGKILL)"
        assert reads.submit(files) is None
    finally:
        reads.close()


def test_a_task_that_fails_in_a_worker_is_said_and_the_caller_reads_itself(files):
    """An error outside the reads' own checks (here a limit no image size compares with) comes back
    as the failure, with the worker named; the caller is told to read itself, and nothing hangs."""
    reads = SharedReads(processes=2, slabs=2, batch_size=len(files), max_pixels="no limit")
    try:
        assert reads.take(reads.submit(files)) is None
        assert reads.failure.startswith(f"the feed's worker process {reads.pids[0]} failed: TypeError: ")
        assert reads.submit(files) is None and len(reads.free) == 2
    finally:
        reads.close()


def test_sending_batches_to_a_stopped_worker_never_waits_on_its_pipe(tmp_path):
    """The caller sends each task as a few numbers (the locations lie in the slab), so batches sent to
    a worker that reads nothing (stopped, or stuck on a hung file system) never fill its pipe and
    block the caller, however long their lists of paths; once it goes on, every batch is read."""
    names = [str(tmp_path / ("long-" * 40 + f"{number}.JPEG")) for number in range(2000)]
    reads = SharedReads(processes=1, slabs=4, batch_size=len(names), max_pixels=10**8)
    try:
        reads.start()
        pid = reads.pids[0]
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        sent = [reads.submit([Location(name, name) for name in names]) for _ in range(4)]
        assert time.monotonic() - started < 5 and all(sent)  # 4 x 0.5 MB of paths: more than a pipe holds
        os.kill(pid, signal.SIGCONT)
        for pending in sent:
            received = reads.take(pending)
            assert [problem for _, _, problem in received.odd.values()] == ["missing (no such file)"] * len(names)
    finally:
        reads.close()


def test_reads_no_longer_wanted_from_a_stopped_worker_are_waited_for_no_longer_than_the_timeout(files):
    """Renewing the slabs (after a pipeline failed) waits for the reads under way, so that no worker
    writes into memory given away; a worker that does not answer (stopped, or stuck on a hung file
    system) is killed after the timeout instead of holding the loader for ever."""
    reads = SharedReads(processes=2, slabs=2, batch_size=len(files), max_pixels=10**8, timeout_s=1)
    try:
        reads.take(reads.submit(files))
        pids = reads.pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        assert reads.submit(files) is not None
        started = time.monotonic()
        reads.renew()
        assert time.monotonic() - started < 10
        assert reads.failure == "TimeoutError: a worker read for more than 1 s (workers.timeout)"
        assert reads.workers == [] and reads.submit(files) is None
        assert processes_end(pids)
    finally:
        reads.close()


EXITS_WITH_STOPPED_WORKERS = """
import json, os, signal, sys
from fastloader.decoding.shared_reads import SharedReads
from fastloader.sources import reading
from fastloader.locations import TAR_BLOCK, Identity, Location, header_digest
reads = SharedReads(processes=2, slabs=2, batch_size=2, max_pixels=10**8)
reads.take(reads.submit([Location(sys.argv[1], sys.argv[1])] * 2))
for pid in reads.pids:
    os.kill(pid, signal.SIGSTOP)
print(json.dumps(reads.pids), flush=True)
"""


def test_a_process_that_exits_with_its_workers_stopped_and_never_closed_ends(files):
    """multiprocessing joins every child it started as the interpreter exits; a worker stopped (or
    stuck in a read of a hung file system) in reads never closed would hold the exit for ever. The
    workers are killed first."""
    done = subprocess.run([sys.executable, "-c", EXITS_WITH_STOPPED_WORKERS, files[0].file], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert processes_end(json.loads(done.stdout))


def test_a_forked_child_that_exits_or_closes_leaves_the_workers_to_their_process(files):
    """A fork of the process (a user's child, a library's) inherits the reads: its exit hooks and a
    close there must not kill the workers, which go on reading for the process that started them."""
    reads = SharedReads(processes=2, slabs=2, batch_size=len(files), max_pixels=10**8)
    try:
        reads.take(reads.submit(files))
        child = os.fork()
        if child == 0:  # the child closes its copy, and its exit hook for unclosed reads runs
            try:
                reads.close()
                shared_reads._kill_started()
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        _same_as_here(reads.take(reads.submit(files)).reads(), files)
        assert reads.failure is None and len(reads.pids) == 2
    finally:
        reads.close()


def _indexed_shard(path: Path, members: list[bytes], identity: bool = True) -> list[Location]:
    """A tar shard of these members, and their locations as a shard index keeps them: each tar
    header's digest and (`identity`) the shard's inode, size and mtime."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for number, data in enumerate(members):
            info = tarfile.TarInfo(f"{number:04d}.jpg")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    stamp = Identity.of(os.stat(path)) if identity else None
    with tarfile.open(path) as archive, open(path, "rb") as handle:
        return [Location(f"{path}:{member.name}", str(path), member.offset_data, member.size,
                         header_digest(os.pread(handle.fileno(), TAR_BLOCK, member.offset_data - TAR_BLOCK)), stamp)
                for member in archive.getmembers()]


def _read_syscalls() -> int:
    return int(next(line for line in open("/proc/self/io") if line.startswith("syscr")).split()[1])


def test_members_side_by_side_are_read_together_and_each_checked_as_if_alone(tmp_path):
    """A val epoch reads a shard's members in the order they lie: a worker reads them with one pread
    (the tar headers and padding between them too), and still finds for each what read_screened finds
    alone: a PNG, a JPEG cut short, a text page, a header not the one indexed, a shard cut short."""
    png = io.BytesIO()
    Image.new("RGB", (30, 20), (1, 2, 3)).save(png, format="PNG")
    members = [_jpeg((20 * n, 90, 200), (64 + n, 48)) for n in range(4)] + [
        png.getvalue(), _jpeg((5, 5, 5), (256, 192))[:300], b"<html>404</html>"] + [
        _jpeg((9, 9 * n, 9), (40, 30 + n)) for n in range(4)]
    locations = _indexed_shard(tmp_path / "a.tar", members)
    locations[8] = locations[8]._replace(header=12345)  # rewritten in place since indexed (size and mtime kept)
    cut = _indexed_shard(tmp_path / "cut.tar", members[:4], identity=False)  # no identity kept: read until short
    os.truncate(tmp_path / "cut.tar", cut[2].start + 100)
    batch = locations + cut
    assert list(reading.runs(batch)) == [(0, 11), (11, 15)]

    slab = shared_reads.Slab(4 << 20)
    for _ in range(2):  # the second: with Pillow's plugins imported by the first
        before = _read_syscalls()
        numbers, odd = shared_reads.read_share(_address(slab), 0, slab.capacity, batch, 10**8,
                                               shared_reads.MappedSlabs())
        spent = _read_syscalls() - before
    # one read a run, and one for each member that then failed a check (read alone): the header
    # rewritten, two cut short; the others' bytes lie in the slab
    assert spent <= 2 + 3 + 2, spent
    here = [read_screened(location) for location in batch]
    for row, (data, screened) in enumerate(here):
        if row in odd:
            assert odd[row][1:] == (screened.format, screened.problem), batch[row].name
        else:
            assert screened.problem is None and screened.format == "JPEG"
            offset, length = numbers[row, 0], numbers[row, 1]
            assert slab.array[offset:offset + length].tobytes() == bytes(data), batch[row].name
            assert tuple(numbers[row, 2:]) == (screened.width, screened.height, screened.turned, screened.coding,
                                               SAMPLINGS.index(screened.sampling))
    assert sorted(odd) == [4, 5, 6, 8, 13, 14]
    assert "the tar header before" in odd[8][2] and "is not the one indexed" in odd[8][2]
    assert re.search(r"cut\.tar ends \d+ bytes into .*cut\.tar:0002\.jpg", odd[13][2]), odd[13]

    reads = SharedReads(processes=2, slabs=1, batch_size=len(batch), max_pixels=10**8)
    try:  # the same through the workers, as the feed asks
        _same_as_here(reads.take(reads.submit(batch)).reads(), batch)
    finally:
        reads.close()


def test_only_local_files_and_ranges_go_to_the_workers():
    assert worker_reads(Location("/a.jpg", "/a.jpg")) and worker_reads(Location("s.tar:m", "/s.tar", 512, 10))
    assert not worker_reads(Location("s3://b/s.tar:m", "s3://b/s.tar", 512, 10))
    assert not worker_reads(Location("row 3", "/t.parquet", 0, 100, row=3))
    assert not worker_reads(Location("mine:3", "mine", reader="token"))


@pytest.fixture
def descriptors_spent():
    """While in it, this process may open no more file descriptors (RLIMIT_NOFILE at the lowest free one)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    @contextlib.contextmanager
    def spent():
        lowest_free = os.dup(0)  # a new descriptor takes the lowest free number, which must be below the limit
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return spent


def test_no_descriptor_left_for_slabs_is_a_failure_the_caller_reads_past(files, descriptors_spent):
    """A slab that cannot be made (no memory, no descriptor left) is no crash: building the reads
    raises OSError with nothing left open (the loader then logs it and reads on its thread), and a
    slab that cannot grow makes `submit` say no, with the reason in `failure`."""
    with descriptors_spent(), pytest.raises(OSError, match="Too many open files"):
        SharedReads(processes=1, slabs=3, batch_size=1, max_pixels=10**8)
    reads = SharedReads(processes=1, slabs=1, batch_size=1, max_pixels=10**8)
    try:
        reads.slabs[0].need = reads.slabs[0].capacity + 1  # the last batch outgrew it
        with descriptors_spent():
            assert reads.submit(files) is None
        assert "Too many open files" in reads.failure and reads.free == reads.slabs
    finally:
        reads.close()


def _address(slab: shared_reads.Slab) -> shared_reads.SlabAddress:
    return shared_reads.SlabAddress(os.getpid(), slab.number, slab.fd, slab.capacity)


def test_the_slabs_a_reader_maps_are_its_own_and_go_with_it(files):
    """The slabs a worker maps belong to its serve loop (MappedSlabs), not to the module: reads in
    this process leave no mapping once their MappedSlabs and the slab are let go (a module table
    kept every slab it ever mapped, in whichever process read)."""
    slab = shared_reads.Slab(1 << 20)
    inode = str(os.fstat(slab.fd).st_ino)
    mapped = shared_reads.MappedSlabs()
    task = shared_reads.Task(0, _address(slab), 0, slab.capacity, files[:3], 10**8)
    numbers, odd = shared_reads.read_task(task, mapped)
    assert not odd and (numbers[:, shared_reads.LENGTH] > 0).all()
    assert list(mapped.by_number) == [slab.number]
    other = shared_reads.MappedSlabs()  # another reader in the same process maps for itself
    assert not other.by_number
    del mapped
    slab.let_go()
    gc.collect()
    assert inode not in _mapped_slabs(os.getpid())


def _mapped_slabs(pid: int) -> set[str]:
    """The feed's memfds a process has mapped now (their inodes, from /proc/<pid>/maps)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[4] for line in lines if "memfd:fastloader-feed" in line}


def test_a_worker_unmaps_the_slabs_the_caller_replaced(files):
    """Slabs replaced as batches grow (and renewed after a failed pipeline) are unmapped in the
    workers at their next task: a worker kept up to 16 of them mapped, tens of MiB each at batch 256,
    that nothing would read again (issue 68.13)."""
    reads = SharedReads(processes=1, slabs=2, batch_size=1, max_pixels=10**8)
    try:
        for _ in range(4):
            reads.capacity = 4096  # room for a file or two: the next batch grows its slab
            reads.renew()
            for _ in range(3):
                pending = reads.submit(files[:5])
                _same_as_here(reads.take(pending).reads(), files[:5])
                reads.release(pending.slab)
        worker = reads.pids[0]
        live = {str(os.fstat(slab.fd).st_ino) for slab in reads.slabs}
        assert _mapped_slabs(worker) <= live and len(_mapped_slabs(worker)) >= 1
    finally:
        reads.close()
