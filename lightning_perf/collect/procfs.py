"""
Process files
=============

:class:`ProcFile`: one of the process's own ``/proc/<pid>/`` files, kept open and re-read with ``pread``: a
few microseconds, where opening it again for each read took 20 us in a tight loop and 0.2-0.3 ms inside a fit
(cProfile of the per-batch scalar writes, which read the resident set at each write).
"""

from __future__ import annotations

import os
from typing import Any


class ProcFile:
    """The contents of ``/proc/<pid>/<name>`` for the calling process, or ``None`` where it cannot be read
    (not Linux).

    The file is opened on first use in each process (a forked or spawned copy opens its own; a descriptor
    inherited from a parent is left to it) and re-read with ``pread``; a pickled copy carries no descriptor.

    Args:
        name: The file under the process's ``/proc`` directory, e.g. ``"statm"``.
        size: The most bytes read.
    """

    def __init__(self, name: str, size: int = 128) -> None:
        self.name, self.size = name, size
        self._fd: int | None = None
        self._pid: int | None = None  # the process the descriptor was opened in

    def __call__(self) -> bytes | None:
        pid = os.getpid()
        if self._pid != pid:
            self._pid = pid
            try:
                self._fd = os.open(f"/proc/{pid}/{self.name}", os.O_RDONLY)
            except OSError:
                self._fd = None
        if self._fd is None:
            return None
        try:
            return os.pread(self._fd, self.size, 0)
        except OSError:
            self.close()
            return None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "_fd": None, "_pid": None}

    def __del__(self) -> None:
        self.close()
