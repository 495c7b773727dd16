"""Process files: kept open, re-read, and each process's own."""

import mmap
import os
import pickle
import sys

import pytest

from lightning_perf.collect.memory import host_rss
from lightning_perf.collect.procfs import ProcFile

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def _pid(file: ProcFile) -> int:
    data = file()
    assert data is not None
    return int(data.split()[0])  # /proc/<pid>/stat starts with the pid


def test_a_forked_child_reads_its_own_file_and_a_pickled_copy_opens_its_own():
    stat = ProcFile("stat", 64)
    assert _pid(stat) == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: the descriptor it inherited is its parent's file
        os.write(write, str(_pid(stat)).encode())
        os._exit(0)
    os.waitpid(child, 0)
    assert int(os.read(read, 64)) == child
    assert _pid(stat) == os.getpid()  # the parent's descriptor, left alone by the child
    copy = pickle.loads(pickle.dumps(stat))
    assert copy._fd is None and _pid(copy) == os.getpid() and copy._fd is not None


def test_the_resident_set_follows_what_the_process_holds():
    # A mapping of its own, each page touched: an allocator's block could reuse pages already resident (a full
    # suite's run read 4 MiB more for a 64-MiB tensor).
    size = 64 * 2**20
    held = mmap.mmap(-1, size)
    before = host_rss()
    for page in range(0, size, mmap.PAGESIZE):
        held[page] = 1
    after = host_rss()
    assert before is not None and after is not None
    assert after - before >= 48 * 2**20
    held.close()


def test_a_file_that_cannot_be_opened_reads_as_none():
    assert ProcFile("no-such-file")() is None
