"""The page shell (lightning_perf.report.html.document) as written and as a real browser runs it: headless
Chromium from ``file://`` with the network blocked (tests/browser.py). Names that would run a script show as
text and run nothing, in tables, headings and charts; the Content-Security-Policy forbids every fetch; the
charts are drawn; a click on a header sorts a table. Each browser test renders one page, once. The harness
itself is tested first: its network is really blocked, and it reads the console back whole."""

from __future__ import annotations

import base64
import html
import http.server
import json
import re
import struct
import subprocess
import sys
import threading
import zlib

import numpy as np
import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

import browser
from lightning_perf.report.html.document import CSP, Cell, Page, Section, chart, esc, number_cell, page, table

SCRIPT = "<script>document.title='pwned'</script>"
CLOSER = "</script><script>document.title='pwned too'</script>"
# An operator-like name with every character HTML and Plotly read: a tag Plotly would draw bold, quotes, "&".
NAME = 'aten::mm<float> "fast" & <b>bold</b>'


def png(width: int, height: int) -> bytes:
    """A white RGB PNG of ``width`` x ``height``, from the format's definition (no imaging library)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff" * 3 * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def shown(text: str) -> str:
    """How a browser serializes ``text`` as a text node in its DOM (quotes as they are)."""
    return html.escape(text, quote=False)


# --- the harness: network blocked, console read back -------------------------------------------------------


@pytest.fixture
def local_server():
    """An HTTP server on this machine's loopback that answers every GET with a PNG and records its path: what
    a page could reach were the network open (the machine may have no other)."""
    requests: list[str] = []
    image = png(1, 1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(image)))
            self.end_headers()
            self.wfile.write(image)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], requests
    server.shutdown()
    server.server_close()


def test_the_browser_reaches_no_network_and_reports_every_console_message(tmp_path, local_server):
    port, requests = local_server
    data_png = "data:image/png;base64," + base64.b64encode(png(1, 1)).decode()
    loads = {
        "loopback": f"http://127.0.0.1:{port}/a.png",
        "localhost": f"http://localhost:{port}/b.png",
        "internet": "http://example.com/c.png",
        "inline": data_png,  # the control: an image the page holds loads
    }
    images = "".join(
        f'<p id="{key}">pending</p><img src="{url}" onload="mark(\'{key}\', \'loaded\')"'
        f" onerror=\"mark('{key}', 'failed')\">"
        for key, url in loads.items()
    )
    path = tmp_path / "network.html"
    path.write_text(
        "<!DOCTYPE html><html><head><title>network</title><script>"
        "function mark(id, what) { document.getElementById(id).textContent = id + ' ' + what; }"
        "</script></head><body>"
        f'{images}<p id="fetch">pending</p><script>'
        f'fetch("http://127.0.0.1:{port}/d").then(function () {{ mark("fetch", "loaded"); }},'
        ' function () { mark("fetch", "failed"); });'
        'console.log("one"); console.warn("two\\nlines"); console.error(\'three "quoted", source: x (1) end\');'
        'setTimeout(function () { throw new Error("four"); }, 10);'
        "</script></body></html>",
        encoding="utf-8",
    )

    rendered = browser.render(path, artifact="browser-network", width=400, height=300)

    assert "loopback failed localhost failed internet failed inline loaded fetch failed" in rendered.text
    assert requests == []  # nothing reached the server that answers every request
    assert rendered.console == ["one", "two\nlines", 'three "quoted", source: x (1) end', "Uncaught Error: four"]
    assert png_size(rendered.screenshot) == (400, 300)
    assert rendered.screenshot.parent == browser.artifacts_dir().resolve()


def test_console_messages_are_read_from_chromiums_log():
    log = "\n".join(
        [
            "/usr/bin/chromium: 9: [: unexpected operator",
            "[1:2:1201/205752.845126:ERROR:dbus/bus.cc:405] Failed to connect to the bus",
            '[1:1:1201/205753.455277:INFO:CONSOLE:3] "hello',
            'second line", source: file:///tmp/p.html (3)',
            '[1:1:1201/205753.455300:INFO:CONSOLE:4] "ends with a line break',
            '", source: file:///tmp/p.html (4)',
            '[1:1:1201/205753.455364:INFO:CONSOLE(7)] "old format", source: file:///tmp/p.html (7)',
            '[1:1:1201/205753.455422:INFO:CONSOLE:3] "cut off',
            "[1:2:1201/205753.455500:WARNING:ui/base/idle/idle_linux.cc:111] unrelated",
            "4948 bytes written to file /tmp/s.png",
        ]
    )
    assert browser.console_messages(log) == [
        "hello\nsecond line",
        "ends with a line break\n",
        "old format",
        "cut off",
    ]


def test_render_rejects_what_it_cannot_open(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such page"):
        browser.render(tmp_path / "missing.html", artifact="missing")
    (tmp_path / "p.html").write_text("<p>x</p>", encoding="utf-8")
    with pytest.raises(ValueError, match="plain file name"):
        browser.render(tmp_path / "p.html", artifact="../outside")


def test_the_screenshot_example_writes_the_picture(tmp_path):
    browser.chromium_or_skip()
    source = tmp_path / "page.html"
    page("A run", "its subtitle", [Section("s", "Section", "<p>body</p>")]).write(source)
    out = tmp_path / "docs" / "page.png"
    example = browser.ROOT / "examples" / "report_screenshot.py"
    done = subprocess.run(
        [sys.executable, example, source, out, "--width", "640", "--height", "480"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"Wrote {out}" in done.stdout
    assert png_size(out) == (640, 480)
    assert browser.chromium.main([str(tmp_path / "missing.html"), str(out)]) == 1


# --- the document, as written ------------------------------------------------------------------------------


def test_esc_is_safe_in_elements_attributes_and_plotly_texts():
    assert esc(NAME) == "aten::mm&lt;float&gt; &#34;fast&#34; &amp; &lt;b&gt;bold&lt;/b&gt;"
    assert esc("it's") == "it&#x27;s"
    assert esc(3.5) == "3.5"
    assert "&quot;" not in esc('"')  # Plotly would show "&quot;" as it is


def test_a_table_escapes_its_text_and_sorts_by_numbers():
    markup = table(
        ["operator", SCRIPT],
        [
            [Cell(SCRIPT), number_cell(None)],
            [Cell('<a href="#w">window</a>', html=True), number_cell(float("inf"), "∞")],
            [NAME, Cell("2.5 ms", sort=np.float64(2.5), num=True)],
        ],
        sortable=True,
        numeric=[False, True],
        id='ops"',
    )
    assert markup.startswith('<table class="sortable" id="ops&#34;"><thead><tr><th class="">operator</th>')
    assert f'<th class="num">{esc(SCRIPT)}</th>' in markup
    assert f"<td>{esc(SCRIPT)}</td>" in markup and "<script>" not in markup
    assert '<td><a href="#w">window</a></td>' in markup  # HTML the package built, as it is
    assert f'<td class="num" data-sort="nan">{number_cell(None).text}</td>' in markup  # missing: sorts last
    assert '<td class="num" data-sort="Infinity">∞</td>' in markup  # what JavaScript's parseFloat reads
    assert '<td class="num" data-sort="2.5">2.5 ms</td>' in markup  # not "np.float64(2.5)"
    with pytest.raises(ValueError, match="numeric has 1 flags for 2 headers"):
        table(["a", "b"], [], numeric=[True])


def test_a_chart_id_is_a_plain_name():
    figure = {"data": [{"type": "bar", "x": ["a"], "y": [1]}], "layout": {}}
    assert '<div id="step-chart_2"' in chart(figure, id="step-chart_2")
    for bad in ['x" onload="alert(1)', "2nd", "a b", ""]:
        with pytest.raises(ValueError, match="chart id"):
            chart(figure, id=bad)


def figures() -> list[dict]:
    """Three charts: names from a trace escaped as the pages escape them, and one name left raw to show that
    chart() alone keeps it inside its script."""
    operators = [esc(SCRIPT), esc(NAME)]
    return [
        {
            "data": [
                {"type": "bar", "x": operators, "y": [1.0, 2.0], "name": esc(SCRIPT), "hovertemplate": "%{y} ms"},
                {"type": "bar", "x": operators, "y": [0.5, 1.5], "name": "CPU"},
            ],
            "layout": {
                "title": {"text": esc(NAME)},
                "xaxis": {"title": {"text": "operator"}},
                "yaxis": {"title": {"text": "self time (ms)"}},
            },
        },
        {
            "data": [
                {"type": "scatter", "x": [0, 1, 2], "y": [3.0, 1.0, 2.0], "name": CLOSER, "mode": "lines"},
                {"type": "scatter", "x": [0, 1, 2], "y": [1.0, 2.0, 2.5], "name": "compute", "mode": "lines"},
            ],
            "layout": {"xaxis": {"title": {"text": "batch"}}, "yaxis": {"title": {"text": "step time (ms)"}}},
        },
        {
            "data": [{"type": "scatter", "x": [0, 1], "y": [10.0, 12.0], "name": "samples/s"}],
            "layout": {"xaxis": {"title": {"text": "epoch"}}, "yaxis": {"title": {"text": "samples/s"}}},
        },
    ]


def hostile_page() -> Page:
    """A page of three charts and a sortable table whose title, subtitle, sections, cells and chart names
    hold scripts and markup."""
    ops = table(
        ["operator", "self time"],
        [[Cell(SCRIPT), number_cell(1.0, "1.0 ms")], [Cell(NAME), number_cell(None)]],
        sortable=True,
        numeric=[False, True],
        id="ops",
    )
    charts = "".join(chart(f, id=f"chart-{i}") for i, f in enumerate(figures()))
    return page(
        SCRIPT, NAME, [Section("ops", SCRIPT, ops), Section("charts", CLOSER, f'<div class="grid">{charts}</div>')]
    )


def _plotted(div: str) -> tuple[str, list]:
    """The chart's ``<div>`` size and the arguments its script gives ``Plotly.newPlot``, as JSON values."""
    size = re.search(r'<div style="([^"]*)">\s*<div id="([^"]+)" class="plotly-graph-div"', div)
    call = re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*(.*)\)\s*};', div, re.S)
    return size.group(1).replace(" ", ""), json.loads(f"[{call.group(1)}]")


@pytest.mark.parametrize("layout", [{}, {"height": 500, "width": 640}], ids=["default size", "sized"])
def test_a_chart_is_what_plotlys_own_writer_writes(layout):
    import plotly.io as pio

    figure = {**figures()[0], "layout": {**figures()[0]["layout"], **layout}}
    figure["data"][0]["y"] = [1.0, float("nan")]  # not a number: null, as plotly writes it
    figure["data"][1]["name"] = CLOSER  # raw: the script's escapes alone keep it inside
    ours = chart(figure, id="chart-0", height=300)
    full = {"height": 300, "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, **figure["layout"]}
    theirs = pio.to_html(
        {"data": figure["data"], "layout": full},
        include_plotlyjs=False,
        full_html=False,
        validate=False,
        config={"displaylogo": False, "responsive": True},
        div_id="chart-0",
        default_width="100%",
        default_height="300px",
    )
    assert _plotted(ours) == _plotted(theirs)
    for escaped in ("\\u003c", "\\u003e", "\\u002f"):  # as plotly escapes a script's JSON
        assert ours.count(escaped) == theirs.count(escaped) > 0, escaped
    assert "</" not in ours.split("<script>")[1].split("</script>")[0]  # no name closes the script


def test_the_figures_are_valid_plotly():
    for figure in figures():
        go.Figure(figure)


def test_a_page_written_is_its_text_with_plotlys_script_copied_from_the_package(tmp_path):
    path = tmp_path / "page.html"
    for written in (hostile_page(), page("t", "s", [Section("a", "A", "<p>no chart</p>")])):
        size = written.write(path)
        assert path.read_bytes() == written.text().encode("utf-8")
        assert size == path.stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # no temporary file left beside it


def test_a_page_that_fails_to_write_leaves_the_old_one(tmp_path):
    path = tmp_path / "page.html"
    page("old", "", [Section("a", "A", "<p>old</p>")]).write(path)
    broken = Page(head="<!DOCTYPE html>", rest="\ud800", plotly=False)  # a lone surrogate: UTF-8 cannot hold it
    with pytest.raises(UnicodeEncodeError):
        broken.write(path)
    assert "<title>old</title>" in path.read_text(encoding="utf-8")
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


def test_a_page_inlines_plotly_once_and_forbids_fetches_first():
    text = hostile_page().text()
    head = text[: text.index("</head>")]
    assert head.startswith('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">')
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in head
    assert head.index("Content-Security-Policy") < head.index("<script")  # in force before any script
    assert text.count(get_plotlyjs()) == 1  # three charts, one bundle
    # Plotly's bundle, one script per chart and the table's: no script from a name.
    assert text.replace(get_plotlyjs(), "").count("<script") == 1 + 3 + 1
    assert f"<title>{esc(SCRIPT)}</title>" in text and f"<h2>{esc(CLOSER)}</h2>" in text
    without = page("t", "s", [Section("a", "A", "<p>no chart</p>")]).text()
    assert "Plotly" not in without and without.count("<script") == 1


# --- the document in the browser ---------------------------------------------------------------------------


def test_a_page_in_the_browser_draws_its_charts_and_runs_no_name(tmp_path):
    path = tmp_path / "page.html"
    hostile_page().write(path)  # as a run writes it: Plotly's script copied from its package

    rendered = browser.render(path, artifact="document-page")

    assert rendered.console == []
    assert rendered.charts == {"chart-0": True, "chart-1": True, "chart-2": True}
    dom = rendered.dom
    assert html.unescape(re.search(r"<title>(.*?)</title>", dom).group(1)) == SCRIPT  # no script renamed it
    assert f"<h1>{shown(SCRIPT)}</h1><p>{shown(NAME)}</p>" in dom
    assert f"<h2>{shown(SCRIPT)}</h2>" in dom and f"<h2>{shown(CLOSER)}</h2>" in dom
    assert f"<td>{shown(SCRIPT)}</td>" in dom
    # Plotly shows the names as written (no bold, no script), in the legends, a title and the axis labels.
    legends = re.findall(r'<text class="legendtext"[^>]*>(.*?)</text>', dom)
    assert shown(SCRIPT) in legends and shown(CLOSER) in legends
    assert re.search(rf'<text class="gtitle"[^>]*>{re.escape(shown(NAME))}</text>', dom)
    ticks = re.findall(r'<g class="xtick"><text [^>]*>(.*?)</text>', dom)
    assert shown(SCRIPT) in ticks and shown(NAME) in ticks
    assert SCRIPT in rendered.text and NAME in rendered.text
    assert png_size(rendered.screenshot) == (1280, 2400)


def test_the_content_security_policy_refuses_every_fetch(tmp_path):
    body = (
        '<p id="img">pending</p>'
        "<img src=\"http://example.com/x.png\" onerror=\"document.getElementById('img').textContent='refused'\">"
        '<link rel="stylesheet" href="http://example.com/s.css">'
        '<script src="http://example.com/s.js"></script>'
        "<style>@font-face { font-family: f; src: url(http://example.com/f.woff); } p { font-family: f; }</style>"
        '<script>fetch("http://example.com/api").catch(function () {});</script>'
    )
    path = tmp_path / "fetches.html"
    page("fetches", "", [Section("s", "S", body)]).write(path)

    rendered = browser.render(path, artifact="document-csp", width=600, height=400)

    assert "refused" in rendered.text
    for url in ["x.png", "s.css", "s.js", "f.woff", "api"]:
        assert any(f"http://example.com/{url}" in m and "Content Security Policy" in m for m in rendered.console), (
            url,
            rendered.console,
        )


SORT_CLICKS = """<script>
(function () {
  var table = document.getElementById("ops"), headers = table.querySelectorAll("th"), seen = [];
  [1, 1, 0, 0].forEach(function (col) {
    headers[col].click();
    var names = Array.prototype.map.call(table.tBodies[0].rows, function (row) { return row.cells[0].textContent; });
    var marked = table.querySelectorAll("th[aria-sort]").length;
    seen.push([names.join(" "), headers[col].getAttribute("aria-sort"), marked]);
  });
  var out = document.createElement("pre");
  out.id = "clicks";
  out.textContent = JSON.stringify(seen);
  document.body.appendChild(out);
})();
</script></body>"""


def test_a_click_on_a_header_sorts_the_table(tmp_path):
    rows = [("a", 3.0), ("b", None), ("c", 1.0), ("d", np.float64(20.0)), ("e", float("inf")), ("f", None)]
    ops = table(
        ["name", "time"],
        [[name, number_cell(value, f"{value} ms" if value is not None else None)] for name, value in rows],
        sortable=True,
        numeric=[False, True],
        id="ops",
    )
    text = page("sorting", "", [Section("s", "S", ops)]).text()
    # The page as written, with a script after the page's own that clicks the headers and notes the order.
    path = tmp_path / "sort.html"
    path.write_text(text.replace("</body>", SORT_CLICKS), encoding="utf-8")

    rendered = browser.render(path, artifact="document-sort", width=600, height=400)

    assert rendered.console == []
    clicks = json.loads(html.unescape(re.search(r'<pre id="clicks">(.*?)</pre>', rendered.dom).group(1)))
    assert clicks == [
        ["c a d e b f", "ascending", 1],  # by number (20 after 3), infinity last of the numbers, missing last
        ["e d a c b f", "descending", 1],  # missing still last, in their order
        ["a b c d e f", "ascending", 1],  # by text; the other header's mark gone
        ["f e d c b a", "descending", 1],
    ]
