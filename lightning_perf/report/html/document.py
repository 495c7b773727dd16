"""
The page shell
==============

One self-contained HTML document: its styles, its few lines of script (sortable tables) and, once per page
when it draws a chart, Plotly's JavaScript, all inline. It loads nothing: its Content-Security-Policy forbids
any fetch (scripts, styles, fonts, images, connections), so a page that would reach the network shows an
error in the browser's console instead of waiting on it, and it opens the same from ``file://`` on a machine
without internet access.

The pages (:mod:`~lightning_perf.report.html.run_page` and the others) are built from the pieces here:

- :func:`esc` for every text that comes from a trace, a user or a report (operator and ``record_function``
  names, module names, paths, findings): nothing from those reaches the page unescaped. That holds inside a
  chart too: Plotly reads a few HTML tags in a figure's texts (names, category labels, hover texts, titles:
  ``<b>``, ``<br>``, ``<a href>``) and decodes entities, so a name goes into a figure through :func:`esc`
  as well, and shows there as written;
- :func:`table` for tables (sortable by a click on a column's header where ``sortable``);
- :func:`chart` for a Plotly figure, given as a plain figure dict (``{"data": [...], "layout": {...}}``, the
  schema ``plotly.graph_objects.Figure`` validates; the tests validate every figure the pages build, the
  page skips that check to stay fast);
- :class:`Section` and :func:`page` for the document itself.

Plotly's Python package is used only for its JavaScript, copied from the package's file into each page written
with a chart (:meth:`Page.write`); the charts themselves are written here (:func:`chart`).
"""

from __future__ import annotations

import functools
import html
import importlib.util
import itertools
import math
import os
import re
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from lightning_perf.layout import atomic_file
from lightning_perf.report.json_report import builtin_value

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; font-src data:;"
    " connect-src 'none'; base-uri 'none'; form-action 'none'"
)
"""Everything inline, nothing fetched (Plotly needs no ``eval``; its images and fonts are inline or local), and
no ``<base>`` or form that could point elsewhere (``default-src`` does not cover those two)."""

# Plotly's options for every chart: no link to Plotly's cloud, no logo, and an image export that works offline.
CHART_CONFIG: Mapping[str, Any] = {"displaylogo": False, "responsive": True}

STYLE = """
:root { --fg: #1d2330; --muted: #5b6474; --line: #d9dde5; --bg: #ffffff; --band: #f5f7fa;
        --critical: #b3261e; --warning: #b26a00; --info: #2f6fb5; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; }
header { padding: 16px 28px; border-bottom: 1px solid var(--line); background: var(--band); }
header h1 { font-size: 20px; margin: 0 0 4px; }
header p { margin: 0; color: var(--muted); }
nav { padding: 8px 28px; border-bottom: 1px solid var(--line); font-size: 13px; }
nav a { margin-right: 14px; color: var(--info); text-decoration: none; }
main { padding: 8px 28px 40px; max-width: 1400px; }
section { margin: 22px 0 30px; }
h2 { font-size: 17px; margin: 0 0 10px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 8px; }
p.note, .muted { color: var(--muted); }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--band); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[aria-sort="ascending"]::after { content: " \\25B2"; }
table.sortable th[aria-sort="descending"]::after { content: " \\25BC"; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
td.name { max-width: 520px; overflow-wrap: anywhere; }
.finding { border-left: 4px solid var(--line); padding: 6px 12px; margin: 10px 0; background: var(--band); }
.finding.critical { border-color: var(--critical); }
.finding.warning { border-color: var(--warning); }
.finding.info { border-color: var(--info); }
.severity { font-weight: 700; text-transform: uppercase; font-size: 11px; margin-right: 6px; }
.critical .severity { color: var(--critical); } .warning .severity { color: var(--warning); }
.info .severity { color: var(--info); }
.finding p { margin: 4px 0; }
.chart { width: 100%; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 10px 24px; }
.banner { border: 1px solid var(--warning); border-left-width: 4px; background: #fff6e5; padding: 8px 12px;
          margin: 8px 0; font-weight: 600; }
.good { color: #1e7d32; } .bad { color: var(--critical); }
"""

# Sortable tables: a click on a header sorts by that column's cells' data-sort (numbers) or text, toggling the
# order; cells without a value sort last.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.getAttribute("aria-sort") !== "ascending";
      table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", asc ? "ascending" : "descending");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var cell = row.cells[col];
        var v = cell ? cell.getAttribute("data-sort") : null;
        return v === null ? (cell ? cell.textContent : "") : parseFloat(v);
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        var xMissing = typeof x === "number" && isNaN(x), yMissing = typeof y === "number" && isNaN(y);
        if (xMissing || yMissing) return xMissing - yMissing;
        var r = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
        return asc ? r : -r;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


def esc(value: object) -> str:
    """``value`` as text, HTML-escaped, quotes too, so that it is safe in an element and inside an attribute;
    also the escape for a text in a Plotly figure, which decodes ``&lt;``, ``&gt;``, ``&amp;`` and numeric
    references but not ``&quot;`` (hence ``&#34;``)."""
    return html.escape(str(value), quote=True).replace("&quot;", "&#34;")


@dataclass(frozen=True)
class Cell:
    """A table cell: its ``text`` (escaped when rendered), the number it sorts by (``None``: by its text; a
    missing value sorts last), and whether it is a number (right-aligned).

    Attributes:
        text: What the cell shows.
        sort: The value it sorts by; ``None`` for text cells.
        num: Whether it is a number column's cell.
        html: ``True`` if ``text`` is HTML built by this package (a link), not to be escaped again.
    """

    text: str
    sort: float | None = None
    num: bool = False
    html: bool = False


def number_cell(value: float | None, text: str | None = None) -> Cell:
    """A numeric cell: ``text`` shown (or a dash where ``value`` is ``None``), sorted by ``value``."""
    if value is None:
        return Cell("\N{EN DASH}", sort=float("nan"), num=True)
    return Cell(text if text is not None else str(value), sort=float(value), num=True)


def value_cells(record: object, columns: Sequence[tuple[str, str, Callable[[Any], str]]]) -> list[Cell]:
    """A record's number cells, one per ``(header, attribute, formatter)`` column: the attribute's value
    formatted, sorted by the value, or a dash where it is ``None``."""
    cells = []
    for _, attr, formatter in columns:
        value = getattr(record, attr)
        cells.append(number_cell(value, None if value is None else formatter(value)))
    return cells


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell | str]],
    *,
    sortable: bool = False,
    numeric: Sequence[bool] | None = None,
    id: str | None = None,
) -> str:
    """An HTML table; a plain ``str`` cell is text. ``numeric`` marks number columns (their headers
    right-aligned); ``sortable`` makes a click on a header sort by that column."""
    numeric = list(numeric) if numeric is not None else [False] * len(headers)
    if len(numeric) != len(headers):
        raise ValueError(f"numeric has {len(numeric)} flags for {len(headers)} headers")
    head = "".join(f'<th class="{"num" if n else ""}">{esc(h)}</th>' for h, n in zip(headers, numeric, strict=True))
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""  # no empty header row over a list of facts
    body = []
    for row in rows:
        cells = []
        for cell in row:
            c = cell if isinstance(cell, Cell) else Cell(cell)
            attrs = ' class="num"' if c.num else ' class="name"' if len(c.text) > 40 else ""
            if c.sort is not None:
                attrs += f' data-sort="{_sort_value(c.sort)}"'
            cells.append(f"<td{attrs}>{c.text if c.html else esc(c.text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    classes = ' class="sortable"' if sortable else ""
    ident = f' id="{esc(id)}"' if id else ""
    return f"<table{classes}{ident}>{thead}<tbody>{''.join(body)}</tbody></table>"


def _sort_value(value: float) -> str:
    """``value`` as JavaScript's ``parseFloat`` reads it back: ``Infinity`` rather than Python's ``inf``, and a
    plain number for a numpy scalar (whose ``repr`` is ``np.float64(...)``); ``nan`` reads as ``NaN``."""
    value = float(value)
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


_chart_ids = itertools.count()
# A chart without an id of its own gets a provisional one, "chart-<nonce>-<n>", that page() renumbers
# "figure-0", "figure-1", ... in the order the charts appear: the same report gives the same page. The nonce,
# drawn once per process, is something no text on a page can spell by chance or on purpose.
_AUTO_PREFIX = f"chart-{secrets.token_hex(6)}-"
_AUTO_ID = re.compile(re.escape(_AUTO_PREFIX) + r"(\d+)")
# A chart's id goes into its <div> and into the script that draws it, both unescaped by Plotly: a plain name.
_CHART_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def chart(figure: Mapping[str, Any], *, id: str | None = None, height: int = 340) -> str:
    """A Plotly figure (a plain figure dict) as a ``<div>`` and the script that draws it, as
    ``plotly.io.to_html(..., include_plotlyjs=False, full_html=False)`` writes them; Plotly's JavaScript itself is
    added once by :func:`page`. Written here, not by plotly's Python package: its first import in a training
    process (``plotly.io.json``, which loads narwhals) took 35-70 ms of the last page's 124 ms at a fit's end. The
    figure's JSON is escaped as Plotly escapes it (``<``, ``>`` and ``/`` as ``\\u003c``, ``\\u003e``,
    ``\\u002f``), so names inside it cannot close the script; non-finite numbers are ``null``. Plotly reads
    ``<b>``, ``<br>`` or ``<a href>`` in the texts it shows, so a name from a trace or a user goes in through
    :func:`esc`.

    Raises:
        ValueError: For an ``id`` that is not a letter followed by letters, digits, ``_`` or ``-``.
    """
    if id is not None and not _CHART_ID.fullmatch(id):
        raise ValueError(f"chart id {id!r}: want a letter, then letters, digits, '_' or '-'")
    div_id = id or f"{_AUTO_PREFIX}{next(_chart_ids)}"
    layout = {"height": height, "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, **figure.get("layout", {})}
    args = ", ".join(_script_json(part) for part in (list(figure.get("data", [])), layout, dict(CHART_CONFIG)))
    width = layout.get("width")  # a number is pixels, as plotly's writer sizes the <div>
    size = f"height:{_css(layout['height'])}; width:{_css(width) if width is not None else '100%'};"
    return (
        f'<div class="chart"><div style="{esc(size)}">'
        f'<div id="{div_id}" class="plotly-graph-div" style="height:100%; width:100%;"></div>'
        f"<script>window.PLOTLYENV=window.PLOTLYENV || {{}};"
        f' if (document.getElementById("{div_id}")) {{ Plotly.newPlot("{div_id}", {args}) }};</script></div></div>'
    )


def _css(size: Any) -> str:
    """A figure's height or width as CSS: a number in pixels, else as given (``"50vh"``)."""
    return f"{size}px" if isinstance(size, (int, float)) and not isinstance(size, bool) else str(size)


_SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("/"): "\\u002f"}


def _script_json(value: Any) -> str:
    """``value`` as JSON that can sit inside a ``<script>`` element (Plotly's escapes); NaN and infinities ``null``."""
    return msgspec.json.encode(value, enc_hook=builtin_value).decode().translate(_SCRIPT_ESCAPES)


@dataclass(frozen=True)
class Section:
    """One part of a page: its anchor id, its heading (text) and its body (HTML built by this package).

    Attributes:
        id: The anchor the page's navigation links to.
        title: The heading.
        body: The section's HTML.
    """

    id: str
    title: str
    body: str


@dataclass(frozen=True)
class Page:
    """A whole document, kept in the two parts around Plotly's JavaScript (4.8 MB): :meth:`write` copies that
    script from Plotly's package into the file between them, where building the page as one text and writing
    it (reading and decoding the script, joining it, encoding the whole) took 40-60 ms of a fit's end.

    Attributes:
        head: The document up to where Plotly's script goes (all of it where ``plotly`` is false).
        rest: The document after it.
        plotly: Plotly's script goes between the two (the page draws a chart).
    """

    head: str
    rest: str
    plotly: bool

    def text(self) -> str:
        """The whole document as one text."""
        return f"{self.head}<script>{_plotly_text()}</script>{self.rest}" if self.plotly else self.head + self.rest

    def write(self, path: str | os.PathLike[str]) -> int:
        """Writes the document to ``path`` atomically (a browser open on it reloads the old page or the new one,
        never half of one); returns its size in bytes."""
        with atomic_file(path) as f:
            f.write(self.head.encode("utf-8"))
            if self.plotly:
                f.write(b"<script>")
                with open(_plotly_js(), "rb") as script:
                    shutil.copyfileobj(script, f)
                f.write(b"</script>")
            f.write(self.rest.encode("utf-8"))
            return f.tell()


def page(title: str, subtitle: str, sections: Sequence[Section]) -> Page:
    """The whole document: header, navigation, ``sections``; Plotly's JavaScript inline once if a section
    draws a chart."""
    bodies = "".join(f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{s.body}</section>' for s in sections)
    nav = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections)
    plotly = 'class="plotly-graph-div"' in bodies
    bodies = _numbered_charts(bodies)
    head = (
        '<!DOCTYPE html>\n<html lang="en"><head>'
        '<meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style>"
    )
    rest = (
        f"</head><body><header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header>"
        f"<nav>{nav}</nav><main>{bodies}</main>"
        f"<script>{SORT_SCRIPT}</script></body></html>\n"
    )
    return Page(head, rest, plotly)


@functools.cache
def _plotly_js() -> str:
    """The path of Plotly's JavaScript in its Python package, the file ``plotly.offline.get_plotlyjs`` reads
    (found without importing ``plotly``: 4-6 ms at a fit's end)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("plotly (a dependency of lightning-perf) is not installed", name="plotly")
    return os.path.join(os.path.dirname(spec.origin), "package_data", "plotly.min.js")


@functools.cache
def _plotly_text() -> str:
    """Plotly's JavaScript as text, read once per process (:meth:`Page.text`; a page written copies the file)."""
    with open(_plotly_js(), encoding="utf-8") as script:
        return script.read()


def _numbered_charts(html_text: str) -> str:
    """``html_text`` with the provisional ids :func:`chart` gave its charts renumbered ``figure-0``,
    ``figure-1``, ... in order of appearance (``figure``: clear of the ids a caller names ``chart-...``)."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"figure-{numbers.setdefault(match.group(1), len(numbers))}"

    return _AUTO_ID.sub(number, html_text)
