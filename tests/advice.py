"""Reading advice as a user does: the DataLoader arguments a finding's advice sets."""

from __future__ import annotations

import ast
import re

SET_DATALOADER = re.compile(r"Set `DataLoader\(([^)]*)\)`")


def settings(advice: str) -> dict[str, object]:
    """The arguments of the advice's ``Set `DataLoader(...)``` sentence (the one that sets something; every
    setting is in that one call), ``{}`` when it sets none."""
    match = SET_DATALOADER.search(advice)
    if match is None:
        return {}
    pairs = (part.split("=") for part in match.group(1).split(","))
    return {name.strip(): ast.literal_eval(value.strip()) for name, value in pairs}
