"""
Who builds the DataLoader and the optimizer
===========================================

Advice that sets a DataLoader argument or an optimizer option is only as good as the user's reach: where an
installed library builds the object (darts builds its DataLoaders inside ``fit``; pytorch-forecasting's
``BaseModel.configure_optimizers`` builds the optimizer from the model's ``optimizer_params``), the user sets it
through that library, or subclasses what builds it. This module names the builder; what to say about it is
:mod:`lightning_perf.diagnose.library_routes`'.

- :func:`installed_package`: the top-level package of a class whose module is an installed package's (under
  ``site-packages`` or ``dist-packages``, or installed with ``pip install --target``); ``None`` for the user's own
  code (a script, a project, an editable install). Lightning's own classes are Lightning's, not a library's,
  except its demos'.
- :func:`hook_builder`: the class that defines a hook (``train_dataloader``, ``configure_optimizers``) for an
  object, where that class is an installed library's.
- :func:`loader_builder`: which hook built a stage's DataLoader (Lightning's ``_DataLoaderSource`` of the stage's
  loop: a LightningModule's or a LightningDataModule's ``*_dataloader``, or loaders passed to the Trainer call).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# Where installed packages live (pip, venv, conda, Debian's python3-* packages); a project installed in
# editable mode stays in its own folder, and is the user's.
_INSTALLED = frozenset({"site-packages", "dist-packages"})
# Lightning's own packages define the hooks' defaults: those are no library's building. Its demos (the
# ``demos`` subpackage: ``MNISTDataModule``, ``BoringModel``) build their DataLoaders and optimizers as a library's
# classes do, from their constructors' arguments: those count.
_LIGHTNING = frozenset({"lightning", "pytorch_lightning", "lightning_fabric"})
_DEMOS = "demos"
# The loops whose ``_data_source`` gives each stage's DataLoaders, as paths of attributes from the Trainer: the
# first one with a source counts (validation in a ``validate`` call, then within ``fit``).
_SOURCES = {
    "train": (("fit_loop",),),
    "validate": (("validate_loop",), ("fit_loop", "epoch_loop", "val_loop")),
    "test": (("test_loop",),),
    "predict": (("predict_loop",),),
}


def installed_package(cls: type) -> str | None:
    """The top-level package of ``cls``'s module where that module is an installed package's; ``None`` for the
    user's own code."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    top = cls.__module__.partition(".")[0]
    if path is None:
        return None
    return top if not _INSTALLED.isdisjoint(Path(path).parts) or _beside_its_metadata(top) else None


def hook_builder(obj: Any, hook: str) -> dict[str, str | None] | None:
    """The installed library whose class defines ``obj``'s ``hook``: ``{"built_by": package, "builder":
    "Class.hook"}``; ``None`` where the user's own class defines it (the nearest definition counts: a subclass of
    the user's that overrides the hook is theirs), or only Lightning does."""
    for cls in type(obj).__mro__:
        if hook in vars(cls):
            package = installed_package(cls)
            if package is None or (package in _LIGHTNING and _DEMOS not in cls.__module__.split(".")):
                return None
            return {"built_by": package, "builder": f"{cls.__qualname__}.{hook}"}
    return None


def loader_builder(trainer: Any, stage: str) -> dict[str, str | None]:
    """Which library's hook built ``stage``'s DataLoaders (:func:`hook_builder` of the stage's data source), as
    ``{"built_by": ..., "builder": ...}``, both ``None`` where the user's code did or loaders were passed in."""
    for path in _SOURCES.get(stage, ()):
        source: Any = trainer
        for name in (*path, "_data_source"):
            source = getattr(source, name, None)
        instance, hook = getattr(source, "instance", None), getattr(source, "name", None)
        if instance is None or not isinstance(hook, str):
            continue
        found = hook_builder(instance, hook) if callable(getattr(instance, hook, None)) else None
        return found or {"built_by": None, "builder": None}
    return {"built_by": None, "builder": None}


def _beside_its_metadata(top: str) -> bool:
    """Whether the top-level package ``top`` was installed outside ``site-packages`` (``pip install --target DIR``):
    the folder that holds it holds a distribution's ``*.dist-info`` whose ``top_level.txt`` names it. One folder
    is read, not every distribution on the path (``importlib.metadata.packages_distributions()``: 0.4-0.6 s)."""
    path = getattr(sys.modules.get(top), "__file__", None)
    if path is None:
        return False
    folder = Path(path).parent
    root = folder.parent if folder.name == top else folder  # a package's folder, or a lone module's
    try:
        for info in root.glob("*.dist-info"):
            names = (
                (info / "top_level.txt").read_text(encoding="utf-8").split()
                if (info / "top_level.txt").is_file()
                else []
            )
            if top in names:
                return True
    except OSError:
        return False
    return False
