"""
Output layout
=============

Where lightning-perf writes, and what the files and directories are called. One place, so that the
callback, the tests and (later) the offline CLI agree.

::

    <dirpath>/                                  # default: <logger.log_dir>/perf (default_dirpath)
        perf_report.json                        # the run's report (lightning_perf.report.json_report)
        report.html                             # the same as one self-contained page (report.html)
        train-epoch000-batches0006-0008/        # one directory per window: a run in the Profiler tab
            rank0.pt.trace.json.gz              # one Kineto trace per rank
            rank0.operators.md                  # the window's operator table
        validate-epoch000-batches0006-0008/
            ...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import BinaryIO

PERF_SUBDIR = "perf"
REPORT_SCHEMA_VERSION = 1  # perf_report.json's "version" (lightning_perf.report.json_report writes the schema)
TRACE_SUFFIX = ".pt.trace.json.gz"
OPERATORS_SUFFIX = ".operators.md"
STAGED_MARK = ".staged"  # in a rank's trace name until every rank of the window has written its own


def default_dirpath(
    log_dir: str | None, root_dir: str, checkpoint_dirs: Sequence[str | None], *, cwd: str
) -> tuple[str, str | None]:
    """Where a run's output goes when the ``dirpath`` option is unset, and what chose it.

    A run writes beside the logs and checkpoints of the program or library that built the Trainer. The first
    of these that the Trainer gives is used:

    1. ``<log_dir>/perf``: the first logger's directory.
    2. ``<root_dir>/perf``: ``default_root_dir`` set to another directory than ``cwd``. Lightning's own
       profilers write there without a logger.
    3. ``<parent>/perf``, the parent of the first local checkpoint directory a ``ModelCheckpoint`` was given. That
       parent is the run's directory in Lightning's own layout (``<log_dir>/checkpoints``) and in libraries that
       follow it (darts: ``darts_logs/<model_name>/checkpoints``). Not inside it: ``ModelCheckpoint`` warns
       when its directory holds other files, and its directory is often copied or pruned as a whole.
    4. ``<root_dir>/perf`` beside a ``ModelCheckpoint`` of no ``dirpath`` (it writes to ``<root_dir>/checkpoints``),
       else ``<cwd>/perf``.

    Args:
        log_dir: The first logger's directory; ``None`` without a logger, or where the logger has no directory.
        root_dir: The Trainer's ``default_root_dir`` (``cwd`` unless set).
        checkpoint_dirs: The ``dirpath`` of each checkpoint callback, ``None`` where it was left unset.
        cwd: The working directory.

    Returns:
        ``(dirpath, place)``: the directory, and ``None`` where a logger chose it, else what did, in words (the
        console says it once).
    """
    if log_dir:
        return os.path.join(log_dir, PERF_SUBDIR), None
    if os.path.abspath(root_dir) != os.path.abspath(cwd):
        return os.path.join(root_dir, PERF_SUBDIR), "in default_root_dir: the Trainer has no logger"
    checkpoints = next((d for d in checkpoint_dirs if d and "://" not in d), None)  # a local one
    if checkpoints is not None:
        parent = os.path.dirname(os.path.normpath(os.path.abspath(checkpoints)))
        return os.path.join(parent, PERF_SUBDIR), "beside the checkpoints: the Trainer has no logger"
    if None in checkpoint_dirs:  # a ModelCheckpoint of no dirpath writes to <root_dir>/checkpoints: beside it
        return os.path.join(root_dir, PERF_SUBDIR), "beside the checkpoints: the Trainer has no logger"
    return os.path.join(cwd, PERF_SUBDIR), (
        "in the working directory: the Trainer has no logger, default_root_dir or checkpoint directory;"
        " PerfCallback(dirpath=...) chooses another"
    )


def staged_path(trace_path: str) -> str:
    """Where a rank writes its trace until every rank of the window has written its own:
    ``rank0.pt.trace.json.gz`` -> ``rank0.pt.trace.json.staged.gz``, a name no trace reader picks up (it ends
    in neither ``.json`` nor ``.json.gz``), gzipped like the final one."""
    base, gz = os.path.splitext(trace_path)
    return base + STAGED_MARK + gz


def page_path(report_path: str) -> str:
    """The run's HTML report beside its ``perf_report.json``: ``report.html``, or ``report-1.html`` beside
    ``perf_report-1.json`` (a second run in the same directory)."""
    directory, name = os.path.split(report_path)
    stem = os.path.splitext(name)[0]
    suffix = stem.removeprefix("perf_report") if stem.startswith("perf_report") else f"-{stem}"
    return os.path.join(directory, f"report{suffix}.html")


def window_dirname(stage: str, epoch: int, first_batch: int, last_batch: int) -> str:
    """A window's directory name; names sort by stage, then epoch, then batch (zero-padded)."""
    return f"{stage}-epoch{epoch:03d}-batches{first_batch:04d}-{last_batch:04d}"


def worker_name(global_rank: int) -> str:
    """The trace's worker name in the Profiler tab: the global rank, unique across nodes."""
    return f"rank{global_rank}"


def trace_filename(global_rank: int) -> str:
    return worker_name(global_rank) + TRACE_SUFFIX


def operators_filename(global_rank: int) -> str:
    return worker_name(global_rank) + OPERATORS_SUFFIX


def unused_name(parent: str, filename: str) -> str:
    """``filename``, or ``stem-1.ext``, ``stem-2.ext``... if ``parent`` already holds a file or directory of
    that name."""
    stem, ext = os.path.splitext(filename)
    name, n = filename, 0
    while os.path.exists(os.path.join(parent, name)):
        n += 1
        name = f"{stem}-{n}{ext}"
    return name


def write_atomically(data: str | bytes, path: str | os.PathLike[str]) -> None:
    """Writes ``data`` (text as UTF-8) to a temporary name beside ``path``, then renames it into place: a
    reader (TensorBoard, a crashed run's user) sees the old file or the new one, never half of one."""
    with atomic_file(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write in pieces (:func:`write_atomically` where the data is not in one piece): written
    under a temporary name beside ``path`` and renamed into place once the block ends without an error; an error
    leaves the old file and no temporary one."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
