"""lightning-perf: PyTorch Lightning callbacks that tell you why training is slow and what to change."""

__version__ = "0.1.0.dev0"

from lightning_perf.callback import PerfCallback  # noqa: E402
from lightning_perf.config import Schedule  # noqa: E402
from lightning_perf.records import EpochSummary, OperatorStat, WindowRecord  # noqa: E402

__all__ = ["EpochSummary", "OperatorStat", "PerfCallback", "Schedule", "WindowRecord", "__version__"]
