"""CompileWatch on real ``torch.compile`` (``aot_eager``): what it counts per stage from Dynamo's callbacks,
counters, log records and compilation metrics, and that it leaves torch as it found it and never gets in a
compile's way."""

import inspect
import logging
import pickle

import pytest
import torch

from lightning_perf.collect.compile import GRAPH_BREAK_LOGGER, CompileSite, CompileWatch
from lightning_perf.collect.dynamo_text import break_reason, guard_text


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class At:
    """Where the run is, as the test moves it."""

    def __init__(self) -> None:
        self.site: CompileSite | None = CompileSite("train", 0)

    def __call__(self) -> CompileSite | None:
        return self.site


def breaks_on_item(x):
    y = x.sin()
    if y.sum().item() > 0:  # the break
        return y * 2
    return y


ITEM_LINE = inspect.getsourcelines(breaks_on_item)[1] + 2


def loops(x, n: int):
    for _ in range(n):  # unrolled: every n is a new graph
        x = x + 1
    return x


LOOPS_LINE = inspect.getsourcelines(loops)[1]


@pytest.fixture
def watched():
    at = At()
    watch = CompileWatch(at)
    assert watch.install()
    yield watch, at
    watch.uninstall()


def test_nothing_compiled_is_none_and_a_stage_without_compiles_is_zero(watched):
    watch, _ = watched
    assert watch.take("train") is None  # a run without torch.compile: no numbers at all
    torch.compile(torch.sin, backend="aot_eager")(torch.randn(3))
    assert watch.take("validate").graphs == 0  # once something compiled, every stage epoch has numbers
    assert watch.take("train").graphs == 1
    assert watch.take("train").graphs == 0  # taken: counting starts again


def test_a_graph_break_is_counted_once_with_its_reason_and_line(watched):
    watch, _ = watched
    compiled = torch.compile(breaks_on_item, backend="aot_eager")
    for _ in range(3):
        compiled(torch.randn(4))
    stats = watch.take("train")
    assert stats.breaks == 1 and stats.graphs >= 1 and stats.steps == (0,) and stats.seconds > 0
    (site,) = stats.break_sites
    assert site.reason == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert site.location == f"tests/collect/test_compile_watch.py:{ITEM_LINE}"


def test_recompiles_name_the_failed_guard_and_the_limit_the_function(watched):
    watch, at = watched
    compiled = torch.compile(loops, backend="aot_eager")
    with torch._dynamo.config.patch(recompile_limit=3):
        for n in range(1, 7):
            at.site = CompileSite("train", n)
            compiled(torch.randn(4), n)
    stats = watch.take("train")
    assert stats.recompiles == 2 and stats.limit_reached
    assert stats.limit_function == f"loops (tests/collect/test_compile_watch.py:{LOOPS_LINE})"
    (guard,) = stats.recompile_guards  # n == 1, n == 2: one guard whose value changes
    assert guard.count == 2 and guard.guard.startswith("n == 2 (for _ in range(n):")
    assert guard.function == f"loops (tests/collect/test_compile_watch.py:{LOOPS_LINE})"
    assert stats.steps == (1, 2, 3)


def test_compiles_go_to_the_stage_and_batch_they_happen_in(watched):
    watch, at = watched
    at.site = CompileSite("validate", None, before_epoch=True)  # the sanity check
    torch.compile(torch.cos, backend="aot_eager")(torch.randn(3))
    at.site = None  # between stages: the run compiles, no stage counts it
    torch.compile(torch.tan, backend="aot_eager")(torch.randn(3))
    at.site = CompileSite("validate", 4)
    torch.compile(torch.sin, backend="aot_eager")(torch.randn(3))
    stats = watch.take("validate")
    assert stats.graphs == 2 and stats.steps == (4,)
    assert 0 < stats.seconds_before < stats.seconds
    assert watch.take("train").graphs == 0


def test_a_failing_where_never_breaks_a_compile():
    def broken() -> CompileSite:
        raise RuntimeError("ours")

    watch = CompileWatch(broken)
    watch.install()
    try:
        assert torch.compile(torch.sin, backend="aot_eager")(torch.zeros(2)).tolist() == [0.0, 0.0]
    finally:
        watch.uninstall()


def test_uninstall_restores_the_logger_and_leaves_a_users_setting_alone():
    breaks = logging.getLogger(GRAPH_BREAK_LOGGER)
    before = (breaks.level, breaks.propagate, list(breaks.handlers))
    watch = CompileWatch(At())
    watch.install()
    assert breaks.isEnabledFor(logging.DEBUG) and not breaks.propagate  # on for us, printing nothing
    torch._dynamo.reset()  # clears torch's callbacks under us
    watch.uninstall()
    assert (breaks.level, breaks.propagate, list(breaks.handlers)) == before
    breaks.setLevel(logging.DEBUG)  # as TORCH_LOGS=graph_breaks leaves it
    breaks.propagate = True
    try:
        watch.install()
        watch.uninstall()
        assert (breaks.level, breaks.propagate) == (logging.DEBUG, True)
    finally:
        breaks.setLevel(before[0])
        breaks.propagate = before[1]


@pytest.mark.parametrize(
    ("reason", "guard"),
    [
        ("0/0: n == 1", "n == 1"),
        ("0/3: n == 4  # for _ in range(n): x = x + 1  # mp/dyn.py:21 in g (_dynamo/variables/tensor.py:2606 in e)",
         "n == 4 (for _ in range(n): x = x + 1; mp/dyn.py:21 in g)"),
        ("0/0: tensor 'x' size mismatch at index 0. expected 4, actual 2\nmore",
         "tensor 'x' size mismatch at index 0. expected 4, actual 2"),
        ("GLOBAL_STATE changed: grad_mode", "GLOBAL_STATE changed: grad_mode"),
    ],
)  # fmt: skip
def test_a_failed_guard_is_one_line_without_torchs_frames(reason, guard):
    assert guard_text(reason) == guard


def test_a_break_reason_skips_dynamos_preamble():
    text = (
        "Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):\n\n"
        "Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: ..."
    )
    assert break_reason(text) == "Unsupported Tensor.item() call with capture_scalar_outputs=False"


def test_a_pickled_watch_keeps_its_numbers_and_installs_again(watched):
    # Trainer(strategy="ddp_spawn") pickles the callbacks, and so the watch, into each process it starts.
    watch, _ = watched
    torch.compile(torch.sin, backend="aot_eager")(torch.randn(3))
    copy = pickle.loads(pickle.dumps(watch))
    assert copy.seen and copy.install()
    try:
        torch.compile(torch.cos, backend="aot_eager")(torch.randn(3))
        assert copy.take("train").graphs == 2  # the one before pickling, and its own
    finally:
        copy.uninstall()


def scaled(x, k: int):
    for _ in range(k):
        x = x * 2
    return x


def test_a_recompile_id_that_comes_again_after_a_reset_names_its_own_guard(watched):
    # torch._dynamo.reset() starts the compile ids again (0/1, 0/2...) but keeps the compilation metrics.
    watch, _ = watched
    for fn in (loops, scaled):
        torch._dynamo.reset()
        watch.keep_installed()  # reset() drops torch's compile callbacks; an epoch start registers them again
        compiled = torch.compile(fn, backend="aot_eager")
        for n in (1, 2, 3):
            compiled(torch.randn(4), n)
        stats = watch.take("train")
        assert stats.recompiles == 2
        assert [g.function.split(" ")[0] for g in stats.recompile_guards] == [fn.__name__]
