"""fastloader.machine: the hardware line and the memory of a process tree, read from real processes."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import PIL
import pytest
import torch

from fastloader.machine import Memory, descendant_pids, hardware, process_memory, tree_memory

MIB = 2**20

CHILD = textwrap.dedent("""
    import mmap, sys
    private = bytearray(64 * 2**20)  # written: 64 MiB of anonymous pages
    for offset in range(0, len(private), 4096):
        private[offset] = 1
    with open(sys.argv[1], "rb") as handle:  # read: 32 MiB of a file's pages, shared with the page cache
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        total = sum(mapped[offset] for offset in range(0, len(mapped), 4096))
    print("ready", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def child(tmp_path):
    """A child process holding 64 MiB it wrote and 32 MiB of a file it mapped, until the test ends."""
    data = tmp_path / "mapped.bin"
    data.write_bytes(b"\x07" * (32 * MIB))
    process = subprocess.Popen([sys.executable, "-c", CHILD, str(data)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        yield process
    finally:
        if process.poll() is None:
            process.communicate("done\n", timeout=30)


def test_hardware_names_the_cores_and_the_library_versions_in_use():
    info = hardware()
    assert 1 <= info["cpu_cores"] <= info["cpu_count"]
    assert info["cpu"] and info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert (info["torch"], info["pillow"], info["torch_threads"]) == (torch.__version__, PIL.__version__,
                                                                       torch.get_num_threads())
    assert ("gpu" in info) == torch.cuda.is_available()


def test_a_childs_written_pages_count_as_anonymous_and_its_mapped_file_as_shared(child):
    assert child.pid in descendant_pids()
    memory = process_memory(child.pid)
    assert memory.anonymous >= 64 * MIB and memory.shared >= 32 * MIB, memory
    assert memory.pss >= 64 * MIB, memory  # pages only the child holds count whole in its PSS


def test_tree_memory_sums_this_process_and_its_children_or_the_children_alone(child):
    workers = tree_memory(include_root=False)
    assert workers.anonymous >= 64 * MIB and workers.shared >= 32 * MIB, workers
    whole = tree_memory()
    assert whole.rss >= workers.rss + process_memory().rss - 16 * MIB  # this process moves a little meanwhile
    assert whole.rss < workers.rss + process_memory().rss + 16 * MIB


def test_an_ended_child_no_longer_counts(child):
    running = tree_memory(include_root=False)
    child.communicate("done\n", timeout=30)
    assert child.pid not in descendant_pids()
    assert tree_memory(include_root=False).anonymous <= running.anonymous - 64 * MIB


def test_memories_add_field_by_field():
    assert Memory(1, 2, 3, 4) + Memory(10, 20, 30, 40) == Memory(11, 22, 33, 44)
