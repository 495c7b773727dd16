"""A training batch's phases as the device ran them (lightning_perf.collect.device_phases), read once the device
has passed the batch's events. Without a GPU here, the events are stand-ins with a device clock of their own (the
real ``torch.cuda.Event`` is used by tests/gpu/test_cuda_phases.py)."""

from __future__ import annotations

import copy

import pytest

from lightning_perf.collect.device_phases import MAX_PENDING, DeviceTimeline
from lightning_perf.collect.phases import AFTER_BACKWARD, BACKWARD, OPTIMIZER, STEP_END, ZERO_GRAD


class Device:
    """A device that runs what was queued at its own pace: ``now`` moves as a test lets it."""

    def __init__(self) -> None:
        self.queued = 0.0  # where the queue ends, in device ms
        self.now = 0.0  # how far the device has run

    def event(self) -> Event:
        return Event(self)


class Event:
    def __init__(self, device: Device) -> None:
        self.device, self.at = device, None

    def record(self) -> None:
        self.at = self.device.queued

    def query(self) -> bool:
        return self.at is not None and self.device.now >= self.at

    def elapsed_time(self, other: Event) -> float:
        assert self.query() and other.query(), "read before the device passed it: a synchronization"
        return other.at - self.at


def batch(timeline: DeviceTimeline, device: Device, index: int, spans: dict[str, float]) -> None:
    """A batch whose phases queue ``spans`` ms of device work each, marked as Lightning marks them."""
    timeline.batch_start(index)
    for name, phase in ((ZERO_GRAD, "forward"), (BACKWARD, "zero_grad"), (AFTER_BACKWARD, "backward")):
        device.queued += spans[phase]
        timeline.mark(name)
    timeline.mark(OPTIMIZER)
    device.queued += spans["optimizer"]
    timeline.mark(STEP_END)
    device.queued += spans["other"]
    timeline.batch_end()


SPANS = {"forward": 4.0, "zero_grad": 0.5, "backward": 8.0, "optimizer": 2.0, "other": 0.5}


def test_a_batch_is_read_once_the_device_passed_it_and_never_before() -> None:
    device = Device()
    timeline = DeviceTimeline(device.event)
    batch(timeline, device, 0, SPANS)
    assert timeline.read() == {}  # the device has run nothing yet: pending, no wait
    device.now = device.queued
    forward, backward, optimizer, other = timeline.read()[0]
    assert (forward, backward, optimizer, other) == pytest.approx((0.004, 0.008, 0.0025, 0.0005))


def test_a_host_far_ahead_keeps_only_the_latest_batches_pending_and_reuses_events() -> None:
    device = Device()
    timeline = DeviceTimeline(device.event)
    for i in range(MAX_PENDING + 4):
        batch(timeline, device, i, SPANS)
    device.now = device.queued
    assert sorted(timeline.read()) == list(range(4, MAX_PENDING + 4))  # the oldest 4 dropped, not waited for
    made = len(timeline._pool)
    batch(timeline, device, MAX_PENDING + 4, SPANS)  # reuses read events: no new one
    assert len(timeline._pool) == made - 7


def test_a_failing_device_stops_the_timeline_and_a_copy_holds_no_event() -> None:
    device = Device()
    timeline = DeviceTimeline(device.event)
    batch(timeline, device, 0, SPANS)
    assert copy.deepcopy(timeline)._pending == type(timeline._pending)()

    def broken() -> Event:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    timeline._pool, timeline._event = [], broken
    timeline.batch_start(1)
    assert timeline.broken == "RuntimeError: CUDA error: an illegal memory access was encountered"
    batch(timeline, device, 2, SPANS)  # nothing raised, nothing recorded
    assert timeline.read() == {}


def test_the_epochs_phases_are_the_devices_where_it_has_passed_them() -> None:
    from lightning_perf.collect.phases import PhaseMarks

    device, host = Device(), iter(float(t) for t in range(1000))
    marks = PhaseMarks(clock=lambda: next(host))
    marks.device = DeviceTimeline(device.event)
    for i in range(3):
        marks.batch_start(next(host))
        for name in (ZERO_GRAD, BACKWARD, AFTER_BACKWARD, OPTIMIZER, STEP_END):
            device.queued += 1.0
            marks.mark(name)
        marks.batch_end(next(host))
        if i == 1:
            device.now = device.queued  # the device has passed batches 0 and 1, not yet 2
    phases = marks.epoch_phases()
    assert phases[0] == pytest.approx((0.001, 0.001, 0.003, 0.0)) and phases[2] is None
    assert marks.phases[0] == (1.0, 1.0, 3.0, 1.0)  # the host's clock: when each was queued
