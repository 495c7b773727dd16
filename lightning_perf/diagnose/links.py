"""
Interconnects
=============

The peak bandwidth of the links collectives run over, per direction, each from its vendor's datasheet, and the
device names (``torch.cuda.get_device_name()``, a trace's ``deviceProperties``) that select one: what a
collective's bus bandwidth (nccl-tests' definition, :mod:`lightning_perf.summarize.collectives`) is compared
with by ``low_bus_bandwidth``.

Notes:
    1. **Per direction.** Datasheets give NVLink's total over both directions ("600 GB/s"); nccl-tests' bus
       bandwidth is per direction, so the entries halve it. PCIe is given per direction.
    2. **Within a node**: an SXM board's GPUs talk over NVLink; a PCIe card (its name says ``PCIe``) over PCIe,
       at its generation's x16 rate. Between nodes the network's NICs set the rate, which no trace names: a run
       of several nodes is judged only against a rate the user gives (``Thresholds.link_bandwidth``).
    3. **Names** are matched case-insensitively on word boundaries, the first entry in table order wins; a name
       no entry matches gives ``None``, and nothing is judged: a guessed link would give a wrong verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """An interconnect: its name, its peak bandwidth per direction (bytes/s), and where the figure is from."""

    name: str
    bandwidth: float
    source: str


PCIE4 = Link("PCIe 4.0 x16", 32e9, "PCI-SIG PCIe 4.0: 16 GT/s per lane, x16 about 32 GB/s per direction")
PCIE5 = Link("PCIe 5.0 x16", 64e9, "PCI-SIG PCIe 5.0: 32 GT/s per lane, x16 about 64 GB/s per direction")

#: (name pattern, link), most specific first (a PCIe card before the SXM board of the same GPU).
LINKS: tuple[tuple[str, Link], ...] = (
    (r"h100 pcie|h100 nvl", PCIE5),
    (r"a100[- ]pcie", PCIE4),
    (r"v100[- ]pcie", Link("PCIe 3.0 x16", 16e9, "PCI-SIG PCIe 3.0: 8 GT/s per lane, x16 about 16 GB/s")),
    (r"b200|gb200", Link("NVLink 5", 900e9, "NVIDIA B200 datasheet: NVLink 1.8 TB/s (both directions)")),
    (r"h100|h200|gh200|h800", Link("NVLink 4", 450e9, "NVIDIA H100 SXM datasheet: NVLink 900 GB/s (both directions)")),
    (r"a100|a800", Link("NVLink 3", 300e9, "NVIDIA A100 datasheet: NVLink 600 GB/s (both directions), SXM4")),
    (r"v100", Link("NVLink 2", 150e9, "NVIDIA V100 datasheet: NVLink 300 GB/s (both directions), SXM2")),
)


#: InfiniBand per port and direction (InfiniBand Trade Association's roadmap: EDR 100, HDR 200, NDR 400, XDR 800
#: Gb/s), for a run of several nodes, whose NICs no trace names: pass one as ``Thresholds(link_bandwidth=...)``,
#: times the NICs a node's GPUs share (``INFINIBAND["NDR"].bandwidth * 8`` for eight NDR ports a node).
INFINIBAND = {
    generation: Link(f"InfiniBand {generation}", gbit * 1e9 / 8, f"IBTA: {generation} {gbit} Gb/s per port")
    for generation, gbit in (("EDR", 100), ("HDR", 200), ("NDR", 400), ("XDR", 800))
}


def node_link(device_name: str | None) -> Link | None:
    """The link between the GPUs of one node named ``device_name``; ``None`` where the table does not know it."""
    if not device_name:
        return None
    name = " ".join(device_name.lower().split())
    for pattern, link in LINKS:
        if re.search(rf"\b(?:{pattern})\b", name):
            return link
    return None
