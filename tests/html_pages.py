"""Reading our HTML pages back in tests: the Plotly figures a page draws, and whether it fetches anything."""

from __future__ import annotations

import json
import re
from typing import Any

_NEW_PLOT = re.compile(r'Plotly\.newPlot\(\s*"([^"]+)",\s*')
_SPACES = re.compile(r"\s*")  # matches anywhere (maybe empty): where the next JSON value starts
# What makes a browser fetch something from the network as it loads a page: an element's source, a style's
# url(...), a stylesheet link. (A link <a href> the reader may follow fetches nothing until followed.)
_FETCH = re.compile(
    r"""\b(?:src|srcset|poster|data)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|<link\b|@import"""
)


def figures_in(page: str) -> dict[str, dict[str, Any]]:
    """The figures a page draws, by the id of their ``<div>``: each ``Plotly.newPlot`` call's data and layout,
    as plain figure dicts (what ``plotly.graph_objects.Figure`` validates)."""
    decoder = json.JSONDecoder()
    figures = {}
    for match in _NEW_PLOT.finditer(page):
        data, end = decoder.raw_decode(page, match.end())
        layout, _ = decoder.raw_decode(page, _SPACES.match(page, page.index(",", end) + 1).end())
        figures[match.group(1)] = {"data": data, "layout": layout}
    return figures


def assert_self_contained(page: str) -> None:
    """The page is one document that fetches nothing: its Content-Security-Policy forbids fetches, and outside
    Plotly's own bundle (whose code holds attribution links it never follows offline) no element or style
    loads from a network address. (An address for the reader, in text or as a link to follow, is allowed.)"""
    from plotly.offline import get_plotlyjs

    assert page.startswith("<!DOCTYPE html>")
    assert '<meta http-equiv="Content-Security-Policy" content="default-src \'none\';' in page
    rest = page.replace(get_plotlyjs(), "")
    fetches = _FETCH.findall(rest)
    assert not fetches, fetches
