"""TrainingThreads with torch's real thread count: lowered by one while a window is processed, put back after,
left alone where a CPU is free already or algorithms are deterministic; a count set meanwhile stays."""

import copy
import pickle

import pytest
import torch

from lightning_perf.collect.threads import TrainingThreads, usable_cpus


@pytest.fixture
def all_cpus():
    """torch's count at one thread per usable CPU, as torch sets it by default; the test's own count put back."""
    before = torch.get_num_threads()
    if usable_cpus() < 2:
        pytest.skip("one usable CPU: there is no thread to give up")
    torch.set_num_threads(usable_cpus())
    yield usable_cpus()
    torch.set_num_threads(before)


def test_lowered_by_one_and_put_back(all_cpus):
    threads = TrainingThreads()
    threads.lower()
    assert threads.lowered and torch.get_num_threads() == all_cpus - 1
    threads.lower()  # once only
    assert torch.get_num_threads() == all_cpus - 1
    threads.restore()
    assert not threads.lowered and torch.get_num_threads() == all_cpus
    threads.restore()  # nothing to put back
    assert torch.get_num_threads() == all_cpus


def test_a_count_set_meanwhile_stays(all_cpus):
    threads = TrainingThreads()
    threads.lower()
    torch.set_num_threads(all_cpus + 1)  # any count but the one set here
    threads.restore()
    assert torch.get_num_threads() == all_cpus + 1


def test_left_alone_where_a_cpu_is_free_or_algorithms_are_deterministic(all_cpus):
    threads = TrainingThreads()
    torch.set_num_threads(all_cpus - 1)
    threads.lower()
    assert not threads.lowered and torch.get_num_threads() == all_cpus - 1
    torch.set_num_threads(all_cpus)
    torch.use_deterministic_algorithms(True)
    try:
        threads.lower()
        assert not threads.lowered and torch.get_num_threads() == all_cpus
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_copy_has_lowered_nothing(all_cpus):
    threads = TrainingThreads()
    threads.lower()
    try:
        assert not pickle.loads(pickle.dumps(threads)).lowered
        assert not copy.deepcopy(threads).lowered
    finally:
        threads.restore()
