"""A package installed as pip installs one (a folder under ``site-packages``), for tests of what the callback
says about code that is a library's, not the user's."""

from __future__ import annotations

import contextlib
import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

# A forecasting library's dataset, as pytorch-forecasting's TimeSeriesDataSet makes a sample: a window of a
# series, normalised by its own mean and spread, smoothed, one sample at a time (a dozen torch calls each).
WINDOWLIB = '''
import torch
from torch.utils.data import Dataset


class Windows(Dataset):
    """Windows of ``length`` points of a random walk, each normalised on its own."""

    def __init__(self, n: int, length: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.series = torch.randn(n + length + 1, generator=g).cumsum(0)
        self.n, self.length = n, length

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = self.series[i : i + self.length]
        center, scale = x.mean(), x.std() + 1e-6
        x = (x - center) / scale
        for _ in range(6):  # smoothing passes
            x = (x + torch.roll(x, 1)) * 0.5
        y = ((self.series[i + self.length] - center) / scale > 0).float().reshape(1)
        return x, y
'''


@contextlib.contextmanager
def installed_package(
    root: Path, name: str, source: str, *, under: str = "site-packages", metadata: bool = False
) -> Iterator[ModuleType]:
    """``source`` as the package ``name`` under ``root / under``, on ``sys.path`` and imported for the ``with``
    block; unloaded after. ``metadata``: with its distribution's ``*.dist-info`` beside it (``top_level.txt``), as
    ``pip install --target`` leaves it."""
    folder = root / under / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(source))
    if metadata:
        info = root / under / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "top_level.txt").write_text(f"{name}\n")
    sys.path.insert(0, str(folder.parent))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(folder.parent))
        sys.modules.pop(name, None)
