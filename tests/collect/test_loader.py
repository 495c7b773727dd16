"""What the DataLoader advice rests on, collected (lightning_perf.collect.loader, .loops, .cpu, .steps): a dataset's
kind and the state it shares with the module, the workers' CPU time, the loops' DataLoader start-up, and the
CPU demand during the wait."""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset

from installed import WINDOWLIB, installed_package
from lightning_perf import PerfCallback
from lightning_perf.collect.cpu import ChildList, RunQueue, children_cpu_seconds, machine_busy_seconds
from lightning_perf.collect.loader import dataset_facts
from lightning_perf.collect.loops import LoopStartTimer
from lightning_perf.collect.steps import StepClock
from models import TinyModel, trainer


class Buffer:
    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []


class Stream(IterableDataset):
    def __init__(self, source) -> None:
        self.source = source

    def __iter__(self):
        return iter(())


class Module:
    """Stands for a LightningModule: only its attributes matter here."""

    def generate(self):
        yield from ()


def test_a_dataset_the_module_holds_is_not_shared_state():
    module = Module()
    module.train_set = TensorDataset(torch.zeros(4, 2))  # `self.train_set = ...; DataLoader(self.train_set)`
    module.transform = lambda x: x  # read-only callables are shared as a rule
    module.train_set.transform = module.transform
    facts = dataset_facts(DataLoader(module.train_set), module)
    assert (facts["dataset"], facts["shared_state"]) == ("map", None)


def test_shared_objects_bound_methods_and_the_module_itself_are_named():
    module = Module()
    module.buffer = Buffer()
    facts = dataset_facts(DataLoader(Stream(module.buffer)), module)
    assert (facts["dataset"], facts["shared_state"]) == (
        "iterable",
        "`dataset.source` is the LightningModule's `buffer`",
    )
    method = dataset_facts(DataLoader(Stream(module.generate)), module)["shared_state"]
    assert method == "`dataset.source` is the LightningModule's method `generate`"
    wrapped = Subset(Stream(functools.partial(print, module)), [0])  # two levels down, through a partial
    assert (
        dataset_facts(DataLoader(wrapped), module)["shared_state"]
        == "`dataset.dataset.source.args[0]` is the LightningModule"
    )


def test_a_dataset_is_the_users_unless_an_installed_package_defines_it(tmp_path):
    own = dataset_facts(DataLoader(Subset(Stream(None), [0])), None)  # through random_split's Subset
    assert (own["dataset_class"], own["dataset_library"]) == ("Stream", None)
    tensors = dataset_facts(DataLoader(TensorDataset(torch.zeros(4, 2))), None)
    assert (tensors["dataset_class"], tensors["dataset_library"]) == ("TensorDataset", "torch")
    with installed_package(tmp_path, "windowlib", WINDOWLIB) as windowlib:
        facts = dataset_facts(DataLoader(Subset(windowlib.Windows(8), [1, 2])), None)
    assert (facts["dataset_class"], facts["dataset_library"]) == ("Windows", "windowlib")


def test_a_package_installed_with_pip_target_is_a_librarys_and_a_project_folder_is_not(tmp_path):
    # `pip install --target DIR`: no site-packages in its path, its dist-info beside it.
    with installed_package(tmp_path / "a", "windowlib", WINDOWLIB, under="target", metadata=True) as windowlib:
        facts = dataset_facts(DataLoader(windowlib.Windows(8)), None)
    assert (facts["dataset_class"], facts["dataset_library"]) == ("Windows", "windowlib")
    with installed_package(tmp_path / "b", "windowlib", WINDOWLIB, under="project") as windowlib:
        facts = dataset_facts(DataLoader(windowlib.Windows(8)), None)
    assert (facts["dataset_class"], facts["dataset_library"]) == ("Windows", None)


def test_a_map_datasets_length_is_recorded_an_iterables_is_not():
    assert dataset_facts(DataLoader(Subset(TensorDataset(torch.zeros(40, 2)), range(10))), None)["dataset_length"] == 10
    assert dataset_facts(DataLoader(Stream(None)), None)["dataset_length"] is None


def test_the_workers_cpu_time_is_read_from_proc():
    if not os.path.isdir("/proc/self/task"):
        assert children_cpu_seconds() is None
        return
    before = children_cpu_seconds()
    pid = os.fork()
    if pid == 0:
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
        os._exit(0)
    os.waitpid(pid, 0)  # ended and waited for: counted by os.times
    assert children_cpu_seconds() - before >= 0.15


# A rank as Lightning's ddp launcher starts it: a child of rank zero, busy itself, whose main thread starts a
# DataLoader worker of its own (busy too), then both stay alive while the epoch is read.
RANK = """
import os, time
def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
if os.fork() == 0:
    spin(0.3)
    time.sleep(60)
spin(0.3)
time.sleep(60)
"""


def _wait_until_spun(pid: int, deadline: float = 30.0) -> None:
    """Until the process ``pid`` and its child both sleep after their spin (a busy machine gives them their CPU
    late), at most ``deadline`` seconds."""

    def asleep(p: str) -> bool:
        try:
            with open(f"/proc/{p}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "S"
        except OSError:
            return False

    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
        if children and asleep(str(pid)) and all(asleep(c) for c in children):
            return
        time.sleep(0.05)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")
def test_other_threads_children_are_listed_every_second_the_calling_threads_every_time():
    now = [0.0]
    children, tasks = ChildList(clock=lambda: now[0]), "/proc/self/task"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    mine, theirs, done = subprocess.Popen(sleeper), [], threading.Event()

    def start_one_and_stay():  # a thread other than the caller's starts a child and lives on (its parent)
        theirs.append(subprocess.Popen(sleeper))
        done.wait(30)

    other = threading.Thread(target=start_one_and_stay)
    try:
        assert str(mine.pid) in children(tasks)  # the first call lists every thread
        other.start()
        while not theirs:
            time.sleep(0.01)
        now[0] = 0.5
        listed = children(tasks)
        assert str(mine.pid) in listed and str(theirs[0].pid) not in listed  # not a parent at the last listing
        now[0] = 1.0
        assert str(theirs[0].pid) in children(tasks)  # the next full listing
        now[0] = 1.5
        assert {str(mine.pid), str(theirs[0].pid)} <= children(tasks)  # its thread is a parent now: read every time
    finally:
        done.set()
        other.join()
        for proc in (mine, *theirs):
            proc.kill()
            proc.wait()


def _stat_busy(names: set[str]) -> float:
    with open("/proc/stat") as f:
        lines = [line.split() for line in f if line.startswith("cpu")]
    ticks = sum(sum(int(v) for v in f[1:9]) - int(f[4]) - int(f[5]) for f in lines if f[0] in names)
    return ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="reads Linux's /proc/stat and CPU affinity")
def test_the_machines_busy_seconds_are_those_of_the_cpus_the_process_may_use():
    allowed = os.sched_getaffinity(0)
    assert abs(machine_busy_seconds() - _stat_busy({f"cpu{i}" for i in allowed})) < 0.5  # all of them: first line
    # One CPU allowed: its own line alone (in a child process, whose affinity is set first).
    cpu = min(allowed)
    code = (
        f"import os; os.sched_setaffinity(0, {{{cpu}}});"
        "from lightning_perf.collect.cpu import machine_busy_seconds; print(machine_busy_seconds())"
    )
    one = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert abs(one - _stat_busy({f"cpu{cpu}"})) < 0.5
    if len(allowed) > 1:
        assert _stat_busy({f"cpu{i}" for i in allowed}) - one > 0.5  # the other CPUs' seconds are left out


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc/stat")
def test_a_virtual_machines_steal_time_is_read_with_the_busy_seconds_and_per_epoch():
    # /proc/stat's 8th value of a cpu line: the host ran something else while the CPU had work. Read nowhere
    # before; this project's 2-CPU VM counted 1.6% of its time since boot, in bursts.
    from lightning_perf.collect.cpu import EpochCpu, machine_cpu_seconds

    allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    with open("/proc/stat") as f:
        lines = [line.split() for line in f if line.startswith("cpu") and line.split()[0] in allowed]
    stolen = sum(int(fields[8]) for fields in lines) / os.sysconf("SC_CLK_TCK")
    busy, steal, cpus = machine_cpu_seconds()
    assert cpus == len(allowed) and 0.0 <= steal - stolen < 0.05 * cpus and busy >= steal
    epoch = EpochCpu()
    epoch.start()
    time.sleep(0.05)
    share = epoch.read()["cpu_steal_share"]
    assert share is not None and 0.0 <= share <= 1.0


def test_the_other_ranks_are_no_workers_but_the_runs_own():
    # Lightning's ddp launcher starts a node's other ranks as rank zero's children: each busy all epoch, they read
    # as a DataLoader worker computing (0.78 of the 1 CPU a rank of BoringModel used, on 2 CPUs); and their own
    # workers, rank zero's grandchildren, read as other processes' load.
    from lightning_perf.collect.cpu import EpochCpu

    ranks, workers = EpochCpu(), EpochCpu()
    rank = subprocess.Popen([sys.executable, "-c", RANK], start_new_session=True)
    try:
        ranks.start(workers=True, ranks={rank.pid})
        workers.start(workers=True)
        _wait_until_spun(rank.pid)  # their 0.6 s of CPU, alive while read (an ended child is no longer told apart)
        as_rank, as_worker = ranks.read(), workers.read()
    finally:
        os.killpg(rank.pid, signal.SIGKILL)  # the rank and its worker
        rank.wait()
    assert as_worker["worker_cpu"] >= 0.2  # read as a worker: the rank's CPU seconds
    assert as_rank["worker_cpu"] < 0.1  # read as a rank: none of a worker's
    # The rank's own worker is the run's, not another process's: 0.3 s less of other processes' load.
    assert (as_worker["other_cpu_load"] - as_rank["other_cpu_load"]) * as_rank["wall_time"] >= 0.2


# Starts RANK and exits: the rank is no child of the test's process, as ddp_spawn's and torchrun's ranks are
# siblings of each other.
_SIBLING = (
    "import subprocess as s, sys; quiet = s.DEVNULL;"
    " print(s.Popen([sys.executable, '-c', sys.argv[1]], stdout=quiet, stderr=quiet, start_new_session=True).pid)"
)


def test_the_other_ranks_that_are_no_children_are_the_runs_own_too():
    # Under ddp_spawn, rank zero read the other rank, its sibling, as other processes' load: 0.53-0.73 CPUs of
    # it on an idle 2-CPU machine (0.0 under ddp), and cpu_contention called the machine busy.
    from lightning_perf.collect.cpu import EpochCpu

    ranks, others = EpochCpu(), EpochCpu()
    launched = subprocess.run([sys.executable, "-c", _SIBLING, RANK], capture_output=True, text=True, check=True)
    rank = int(launched.stdout)
    try:
        ranks.start(workers=True, ranks={rank})
        others.start(workers=True)
        _wait_until_spun(rank)
        as_rank, as_other = ranks.read(), others.read()
    finally:
        os.killpg(rank, signal.SIGKILL)  # the rank and its worker
    assert as_rank["worker_cpu"] < 0.1 and as_other["worker_cpu"] < 0.1  # no child of ours either way
    # The rank and its worker (0.6 s of CPU) are the run's own, not another process's.
    assert (as_other["other_cpu_load"] - as_rank["other_cpu_load"]) * as_rank["wall_time"] >= 0.4


def test_the_loop_timer_times_the_loops_and_puts_them_back():
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    loop = trainer.test_loop
    ticks = iter([1.0, 1.25, 2.0, 2.5])
    timer = LoopStartTimer(clock=lambda: next(ticks))
    timer.install(trainer)
    assert "reset" in vars(loop) and "setup_data" in vars(trainer.fit_loop)
    wrapped = vars(loop)["reset"]
    assert wrapped.__name__ == "reset"  # functools.wraps: it reads as the loop's own
    with contextlib.suppress(Exception):  # the real reset needs a running trainer: the time is still counted
        wrapped()
    assert timer.take("test") == 0.25 and timer.take("test") == 0.0
    timer.uninstall()
    assert "reset" not in vars(loop) and "setup_data" not in vars(trainer.fit_loop)


def test_the_run_queue_counts_waiting_for_a_cpu_not_sleeping_and_pickles_without_its_descriptor():
    queue = RunQueue()
    start = queue()
    time.sleep(0.1)
    assert queue() - start < 0.05  # asleep, the thread wants no CPU
    copy = pickle.loads(pickle.dumps(queue))
    assert copy._file._fd is None and copy() is not None


def test_a_loading_thread_queued_for_a_cpu_is_not_using_one():
    # A dataset that sleeps 2 ms per item on a busy machine: after each wake the thread queues for a CPU, 60% of
    # the wait here. Counted as CPU use, that read "on the CPU" (CPU_BOUND, 50%); it used 5% of its wait.
    ticks, cpu, queue = iter(range(0, 1000, 10)), iter([0.0, 0.5, 0.5]), iter([0.0, 6.0, 6.0])
    clock = StepClock(
        lambda batch: None,
        keep_loss=False,
        clock=lambda: float(next(ticks)),
        cpu_clock=lambda: next(cpu),
        queue_clock=lambda: next(queue),
    )
    clock.epoch_start()
    for _ in range(2):  # batch 1's wait is sampled: 10 s of wall time, 6 of them queued, 0.5 on a CPU
        clock.batch_start(None)
        clock.batch_end(None)
        clock.restart()
    assert clock.sampled_wait == 10.0
    assert clock.loading_cpu_share() == pytest.approx(0.5 / 4) and clock.loading_queue_share() == pytest.approx(0.6)


def test_the_clock_samples_every_fourth_wait_from_batch_one():
    ticks = iter(range(1000))
    cpu = iter(range(0, 10000, 10))
    clock = StepClock(
        lambda batch: None,
        keep_loss=False,
        clock=lambda: float(next(ticks)),
        cpu_clock=lambda: float(next(cpu)),
        queue_clock=lambda: 0.0,
    )
    clock.epoch_start(waited=5.0)
    for _ in range(6):
        clock.batch_start(None)
        clock.batch_end(None)
        clock.restart()
    assert clock.data_wait[0] >= 5.0  # the start-up before the epoch-start hook
    # Batches 1 and 5: one wall tick and ten CPU seconds each (the fake clocks step by 1 and 10 per read): each wait
    # all on a CPU (several threads' CPU seconds count as one wait's, at most).
    assert clock.sampled_wait == 2.0 and clock.sampled_wait_cpu == 20.0 and clock.loading_cpu_share() == 1.0


def test_past_an_epochs_first_64_batches_the_clock_samples_every_32nd_wait():
    ticks = iter(range(10_000))
    cpu = iter(range(0, 100_000, 10))
    sampled = []
    clock = StepClock(
        lambda batch: None,
        keep_loss=False,
        clock=lambda: float(next(ticks)),
        cpu_clock=lambda: float(next(cpu)),
        queue_clock=lambda: 0.0,
    )
    clock.epoch_start()
    for batch in range(200):
        before = clock.sampled_wait
        clock.batch_start(None)
        if clock.sampled_wait > before:
            sampled.append(batch)
        clock.batch_end(None)
        clock.restart()
    assert sampled == [*range(1, 64, 4), 65, 97, 129, 161, 193]


def test_an_epochs_cpu_wait_leaves_out_what_pause_covers():
    # This thread and a CPU burner share one CPU while paused (a window's own CPU use), then the burner stops: the
    # epoch's share counts only the quiet part. The same without the pause counts the shared CPU. Each part's own
    # wait is read here too, so that the check holds when other processes load the machine as well.
    from lightning_perf.collect.cpu import EpochCpu, RunQueue

    queue = RunQueue()

    def spin(seconds: float) -> tuple[float, float]:
        """Spins ``seconds``; the seconds it waited for a CPU meanwhile, and its wall seconds."""
        waited, since = queue(), time.perf_counter()
        end = since + seconds
        while time.perf_counter() < end:
            pass
        return queue() - waited, time.perf_counter() - since

    def epoch(paused: bool) -> tuple[float | None, tuple[float, float], tuple[float, float]]:
        cpu = EpochCpu()
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(burner.pid, {one})
            cpu.start()
            if paused:
                cpu.pause()
            shared_part = spin(0.4)
        finally:
            burner.kill()
            burner.wait()
        cpu.resume()
        quiet_part = spin(0.2)
        return cpu.read()["cpu_wait_share"], shared_part, quiet_part

    before = os.sched_getaffinity(0)
    one = min(before)
    os.sched_setaffinity(0, {one})
    try:
        (whole, shared, quiet), (left_out, _, quiet_after_pause) = epoch(paused=False), epoch(paused=True)
    finally:
        os.sched_setaffinity(0, before)
    assert whole is not None and left_out is not None
    # Paused: the epoch's share is its quiet part's.
    assert abs(left_out - quiet_after_pause[0] / quiet_after_pause[1]) < 0.03, (left_out, quiet_after_pause)
    # Not paused: both parts', the shared one waiting half its time or more.
    assert shared[0] / shared[1] > 0.3, shared
    assert abs(whole - (shared[0] + quiet[0]) / (shared[1] + quiet[1])) < 0.03, (whole, shared, quiet)


class Batches:
    """An iterable of ready batches the Trainer iterates itself, as gluonts' ``IterableSlice`` is."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(self.n):
            x = torch.randn(4, 16, generator=g)
            yield x, (x.sum(1, keepdim=True) > 0).float()


def test_a_stage_without_a_dataloader_records_the_class_it_iterates(tmp_path):
    callback = PerfCallback(max_windows=0, verbose=0)
    trainer(tmp_path, [callback], limit_val_batches=0).fit(TinyModel(), train_dataloaders=Batches(6))
    loaders = callback.report["run"]["dataloaders"]
    assert loaders["train"] == {"iterable_class": "Batches", "iterable_library": None}
