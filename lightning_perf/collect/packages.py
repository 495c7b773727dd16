"""
Lightning's two packages
========================

Lightning ships the same trainer twice: as ``lightning.pytorch`` (the ``lightning`` package) and as the
standalone ``pytorch_lightning`` package (lightning-bolts, many older projects). Their classes are distinct:
a ``pytorch_lightning.loggers.TensorBoardLogger`` is no ``lightning.pytorch.loggers.TensorBoardLogger``, so
every ``isinstance`` check against a Lightning class must accept both packages' classes.

``pytorch_lightning`` is never imported here: a run that did not import it holds none of its objects, so its
classes are looked up only when it is already in ``sys.modules``.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

STANDALONE = "pytorch_lightning"


def lightning_classes(module: str, name: str) -> tuple[type, ...]:
    """The class ``name`` of ``lightning.pytorch.<module>``, and of ``pytorch_lightning.<module>`` when the
    process has imported ``pytorch_lightning``; for ``isinstance``.

    Args:
        module: The submodule under the package, e.g. ``"loggers"``, ``"profilers"``.
        name: The class, e.g. ``"TensorBoardLogger"``.
    """
    classes = [getattr(importlib.import_module(f"lightning.pytorch.{module}"), name)]
    if STANDALONE in sys.modules:
        # (ImportError, AttributeError: another version, without that class: none of its objects exist)
        with contextlib.suppress(ImportError, AttributeError):
            classes.append(getattr(importlib.import_module(f"{STANDALONE}.{module}"), name))
    return tuple(classes)
