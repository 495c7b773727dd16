"""
PerfCallback for the standalone ``pytorch_lightning`` package
=============================================================

:class:`lightning_perf.PerfCallback` is a ``lightning.pytorch`` callback. A ``pytorch_lightning.Trainer``
runs it as it is when it is given in a list (``Trainer(callbacks=[PerfCallback()])``), but its LightningCLI
(jsonargparse) accepts only subclasses of ``pytorch_lightning.Callback`` in ``trainer.callbacks``. This one is
both (its own name, so that a short ``PerfCallback`` in a ``lightning.pytorch`` config stays unambiguous);
use it in a ``pytorch_lightning`` project's config::

    trainer:
      callbacks:
        - class_path: lightning_perf.standalone.StandalonePerfCallback
          init_args: {max_windows: 2}

Importing this module imports ``pytorch_lightning``.
"""

from __future__ import annotations

import pytorch_lightning

from lightning_perf import callback


# Each package's hooks name its own Trainer and LightningModule, so mypy sees every hook as incompatible
# between the two bases; Lightning calls them with its own classes, which is what each base expects.
class StandalonePerfCallback(callback.PerfCallback, pytorch_lightning.Callback):  # type: ignore[misc]
    """:class:`lightning_perf.PerfCallback`, also a ``pytorch_lightning.Callback`` (same arguments)."""
