"""lightning-perf: PyTorch Lightning callbacks that tell you why training is slow and what to change."""

from lightning_perf.callback import PerfCallback
from lightning_perf.config import Schedule
from lightning_perf.records import OperatorStat, WindowRecord

__all__ = ["OperatorStat", "PerfCallback", "Schedule", "WindowRecord"]
__version__ = "0.1.0.dev0"
