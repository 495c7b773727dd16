"""
Readers of untrusted files
==========================

The offline CLI reads files a user points it at: Kineto traces (``.json`` or ``.json.gz``) and
``perf_report.json`` files. :func:`load_trace` and :func:`load_report` read them, check the structure the
analyses rely on, and turn every problem (a missing file, a truncated gzip, invalid UTF-8 or JSON, a field
of the wrong type) into an :class:`InputError` whose message names the file and what is wrong with it, ready
to print as ``lightning-perf: error: <message>``. Nothing else escapes them: no ``KeyError`` or
``TypeError`` deep inside an analysis later on.

- :mod:`.files`: the error, its wording, reading a file's bytes and JSON;
- :mod:`.trace`: :func:`load_trace`, the one reader of Kineto traces;
- :mod:`.report`: :func:`load_report`.

This package imports neither torch nor lightning.
"""

from lightning_perf.readers.files import InputError
from lightning_perf.readers.report import load_report
from lightning_perf.readers.trace import load_trace

__all__ = ["InputError", "load_report", "load_trace"]
