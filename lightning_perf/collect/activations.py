"""
Where activations come from
===========================

Which modules' activations fill a training step's memory: :class:`SavedSizes` adds up, during one batch (the one
whose FLOPs are counted; nothing on any other), the bytes of the tensors autograd saves for the backward
(``torch.autograd.graph.saved_tensors_hooks``), parameters left out, each storage once, charged to the innermost
module running when it was saved (module forward hooks, for that batch only). It names the blocks that save the
most: about what activation checkpointing around each frees at the step's peak. Measured on CPU
(tests/callback/test_model_memory.py, three blocks of 2.1 MiB saved each, all checkpointed): the peak fell by
1.7 MiB, 82% of one block's figure (the backward allocates the gradients as it frees activations). A container of
blocks (``nn.Sequential`` of modules with children, a ``ModuleList``) is not named itself: its blocks are, one
checkpoint each (a whole container recomputed in the backward brings its peak back).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

BLOCKS = 3
"""Blocks named: those that save the most, none inside another."""
MAX_DEPTH = 6
"""Blocks at most this deep in the module tree (``model.bert.encoder.layer.0`` is 5)."""
MAX_SHARE = 0.5
"""A block that saves more than this share of the batch's whole is not named: checkpointed, it recomputes that
much at once in the backward, so the step's peak barely falls (a wrapper of the whole model, ``model.bert``)."""


class SavedSizes:
    """Bytes autograd saves for the backward during one batch, by the module that saved them."""

    def __init__(self) -> None:
        self._bytes: dict[int, int] = {}
        self._seen: set[tuple[str, int]] = set()
        self._stack: list[int] = []
        self._outside = 0  # saved outside any module (the loss, the step's own code)
        self._exits: contextlib.ExitStack | None = None

    @property
    def active(self) -> bool:
        return self._exits is not None

    def start(self) -> None:
        """Starts: what the forward saves from now until :meth:`stop`, on this thread."""
        self.cancel()
        self._bytes, self._seen, self._stack, self._outside = {}, set(), [], 0
        with contextlib.ExitStack() as exits:
            handles: list[RemovableHandle] = [
                nn.modules.module.register_module_forward_pre_hook(self._enter),
                nn.modules.module.register_module_forward_hook(self._leave, always_call=True),
            ]
            for handle in handles:
                exits.callback(handle.remove)
            exits.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack))
            self._exits = exits.pop_all()

    def _enter(self, module: nn.Module, args: Any) -> None:
        self._stack.append(id(module))

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack and self._stack[-1] == id(module):
            self._stack.pop()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if not (base.is_leaf and base.requires_grad):  # a parameter (or a view of one) is no activation
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if key not in self._seen and key[1]:
                self._seen.add(key)
                if self._stack:
                    self._bytes[self._stack[-1]] = self._bytes.get(self._stack[-1], 0) + storage.nbytes()
                else:
                    self._outside += storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        """Every byte saved for the backward so far (in modules or not): the batch's activations."""
        return sum(self._bytes.values()) + self._outside

    def stop(self, root: nn.Module) -> tuple[tuple[str, int], ...]:
        """Stops, and returns the :data:`BLOCKS` blocks of ``root`` that saved the most, ``(qualified name, bytes)``,
        largest first: modules with children, at most :data:`MAX_DEPTH` deep, neither ``root`` nor a container of
        blocks, at most :data:`MAX_SHARE` of the whole, none inside another named one."""
        self.cancel()
        sizes, total = self._bytes, self.total
        candidates: list[tuple[str, int]] = []
        for name, module in root.named_modules():
            if not name or name.count(".") >= MAX_DEPTH or not _has_children(module) or _list_of_blocks(module):
                continue
            saved = sum(sizes.get(id(m), 0) for m in module.modules())
            if 0 < saved <= MAX_SHARE * total:
                candidates.append((name, saved))
        candidates.sort(key=lambda block: -block[1])
        named: list[tuple[str, int]] = []
        for name, saved in candidates:
            if not any(_nested(name, other) for other, _ in named):
                named.append((name, saved))
        return tuple(named[:BLOCKS])

    def cancel(self) -> None:
        """Removes the hooks, if any: safe to call at any time."""
        exits, self._exits = self._exits, None
        if exits is not None:
            exits.close()


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _has_children(module: nn.Module) -> bool:
    return any(True for _ in module.children())


def _list_of_blocks(module: nn.Module) -> bool:
    """A container (``Sequential``, ``ModuleList``, ``ModuleDict``) of two or more modules that have children."""
    if not isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
        return False
    return sum(1 for child in module.children() if _has_children(child)) >= 2


def _nested(name: str, other: str) -> bool:
    """One of two qualified module names is inside the other (or they are the same)."""
    return name == other or name.startswith(other + ".") or other.startswith(name + ".")
