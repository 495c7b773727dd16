"""The console lines of reported stage epochs: something new at once, nothing new at most every STATUS_SECONDS per
stage, the latest held back at the end."""

from clocks import FakeClock
from lightning_perf.diagnose.model import Finding
from lightning_perf.hooks.console_lines import STATUS_SECONDS, ConsoleLines
from lightning_perf.summarize.steps import summarize_epoch


def _epoch(stage: str, epoch: int):
    return summarize_epoch(stage=stage, epoch=epoch, data_wait=[0.01] * 4, compute=[0.1] * 4, batch_sizes=[8] * 4)


def _wait(stage: str, epoch: int, share: int = 29) -> Finding:
    return Finding(id="dataloader_bound", severity="warning", title=f"waits {share}%", evidence="e", advice="a",
                   stage=stage, epoch=epoch)  # fmt: skip


def test_a_line_with_nothing_new_waits_its_time_and_the_latest_comes_at_the_end():
    clock, said = FakeClock(), []
    lines = ConsoleLines(verbose=1, clock=clock)
    lines.epoch(said.append, _epoch("train", 0), [_wait("train", 0)], order=0)  # new: at once
    clock.now += 0.5
    lines.epoch(said.append, _epoch("validate", 0), [], order=1)  # another stage's first line: at once
    lines.epoch(said.append, _epoch("train", 1), [_wait("train", 1)], order=2)  # unchanged, 0.5 s on: held
    lines.epoch(said.append, _epoch("validate", 1), [], order=3)  # nothing, 0 s after its last: held
    assert [line.split(" | ")[1] for line in said] == ["train epoch 0", "validate epoch 0"]
    clock.now += STATUS_SECONDS
    lines.epoch(said.append, _epoch("train", 2), [_wait("train", 2)], order=4)  # unchanged, its time: printed
    assert said[-1].startswith("lightning-perf | train epoch 2") and said[-1].endswith("unchanged: dataloader_bound")
    lines.epoch(said.append, _epoch("train", 3), [_wait("train", 3, share=80)], order=5)  # changed: at once
    assert said[-1].startswith("lightning-perf | train epoch 3") and "\n" in said[-1]
    lines.flush(said.append)  # the latest held back: validate's epoch 1 (train's was replaced by later lines)
    assert [line.split(" | ")[1] for line in said[-1:]] == ["validate epoch 1"]
    lines.flush(said.append)
    assert len(said) == 5


def test_a_line_said_now_is_printed_whatever_the_time():
    clock, said = FakeClock(), []
    lines = ConsoleLines(verbose=1, clock=clock)
    lines.epoch(said.append, _epoch("train", 0), [], order=0)
    lines.epoch(said.append, _epoch("train", 1), [], order=1, now=True)  # an interrupted epoch, a call's end
    assert len(said) == 2


def test_a_new_finding_the_line_does_not_show_is_no_news():
    # At verbose=1 an info finding is not shown: a line whose only new finding is one reads as nothing new.
    clock, said = FakeClock(), []
    lines = ConsoleLines(verbose=1, clock=clock)
    lines.epoch(said.append, _epoch("train", 0), [_wait("train", 0)], order=0)
    note = Finding(id="memory_breakdown", severity="info", title="what fills memory", evidence="e", advice="a",
                   stage="train", epoch=1)  # fmt: skip
    lines.epoch(said.append, _epoch("train", 1), [_wait("train", 1), note], order=1)
    assert len(said) == 1
    verbose = ConsoleLines(verbose=2, clock=clock)  # shown at verbose=2: news
    verbose.epoch(said.append, _epoch("train", 0), [_wait("train", 0)], order=0)
    verbose.epoch(said.append, _epoch("train", 1), [_wait("train", 1), note], order=1)
    assert len(said) == 3
