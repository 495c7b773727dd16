"""Opening our HTML pages in a real browser in tests: Debian's headless Chromium, from ``file://``, with the
network blocked; what the page became once its scripts ran, what it said on the console, and its picture.

One Chromium run per :func:`render` (about 1 s for a small page, 2-4 s for one with Plotly's 4.8 MB bundle on
two shared cores); the command line is the one ``examples/report_screenshot.py`` uses for the README's picture.
Chromium writes each console message (``console.*`` calls, uncaught exceptions, Content-Security-Policy
violations) to its log as ``[pid:tid:time:INFO:CONSOLE:line] "message", source: url (line)``, a message with
line breaks continuing on the lines after it; :func:`console_messages` reads them back.

Without Chromium the tests that render skip, naming ``apt-get install chromium`` (``make test`` installs it);
where the environment variable ``CI`` is set they fail instead: CI must run them.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_spec = importlib.util.spec_from_file_location("report_screenshot", ROOT / "examples" / "report_screenshot.py")
assert _spec is not None and _spec.loader is not None
chromium = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chromium)

ARTIFACTS_ENV = "LP_TEST_ARTIFACTS"
"""Where the screenshots go, when set; else ``test-artifacts/`` at the repository's root (git-ignored)."""

LOGGING = ("--dump-dom", "--enable-logging=stderr", "--v=0")
"""The DOM to stdout once the page's scripts ran; the log, console messages included, to stderr."""

_ARTIFACT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A log line's prefix, "[pid:tid:MMDD/HHMMSS.micros:LEVEL:" (pid and tid only where Chromium adds them).
_PREFIX = r"\[(?:\d+:)*\d{4}/\d{6}\.\d+:[A-Z_]+"
_LOG_LINE = re.compile(_PREFIX)
_CONSOLE = re.compile(_PREFIX + r':CONSOLE[^\]]*\] "(.*)$')
_SOURCE = re.compile(r'(.*)", source: .* \(\d+\)$', re.DOTALL)

_CHART_DIV = re.compile(r'<div\b[^>]*\bclass="[^"]*\bplotly-graph-div\b[^>]*>')
_DRAWN = re.compile(r'<svg\b[^>]*\bclass="main-svg"')
_ID = re.compile(r'\bid="([^"]*)"')


@dataclass(frozen=True)
class Rendered:
    """A page as Chromium left it.

    Attributes:
        dom: The document serialized after its scripts ran (charts drawn, tables sorted).
        console: Every console message the page produced, in order: its logs, warnings and errors, uncaught
            exceptions (``"Uncaught Error: ..."``), Content-Security-Policy violations. A good page has none.
        screenshot: The PNG of the window, kept under ``test-artifacts/`` (see :data:`ARTIFACTS_ENV`).
    """

    dom: str
    console: list[str]
    screenshot: pathlib.Path

    @functools.cached_property
    def text(self) -> str:
        """What a reader sees: the DOM's text (Plotly's legends and axes included) outside ``<head>``,
        ``<script>`` and ``<style>``, unescaped; one space between two elements' texts and for each run of
        whitespace."""
        parser = _Text()
        parser.feed(self.dom)
        parser.close()
        return " ".join(" ".join(parser.parts).split())

    @functools.cached_property
    def charts(self) -> dict[str, bool]:
        """Each Plotly chart's ``<div>`` id, and whether Plotly drew it (an ``svg.main-svg`` inside)."""
        tags = list(_CHART_DIV.finditer(self.dom))
        drawn = {}
        for tag, after in zip(tags, [*tags[1:], None], strict=True):
            ident = _ID.search(tag.group())
            inside = self.dom[tag.end() : after.start() if after else len(self.dom)]
            drawn[ident.group(1) if ident else f"#{len(drawn)}"] = bool(_DRAWN.search(inside))
        return drawn


class _Text(HTMLParser):
    _HIDDEN = frozenset({"head", "script", "style", "template"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self._HIDDEN:
            self.hidden += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN and self.hidden:
            self.hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def artifacts_dir() -> pathlib.Path:
    """Where the screenshots are kept: ``$LP_TEST_ARTIFACTS``, else ``test-artifacts/`` at the root."""
    return pathlib.Path(os.environ.get(ARTIFACTS_ENV) or ROOT / "test-artifacts")


def chromium_or_skip() -> str:
    """Chromium's path; skips the test when it is missing, or fails it where ``CI`` is set."""
    executable = shutil.which(chromium.EXECUTABLE)
    if executable is None:
        reason = "headless Chromium not found: `apt-get install chromium` (or `make test`, which installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the browser tests", pytrace=False)
        pytest.skip(reason)
    return executable


def render(html_path: str | os.PathLike, *, artifact: str, width: int = 1280, height: int = 2400) -> Rendered:
    """Opens ``html_path`` in headless Chromium, offline, lets its scripts run, and reads back its DOM, its
    console and its picture (kept as ``<artifact>.png``).

    Args:
        html_path: The page.
        artifact: The screenshot's name, without ``.png`` (letters, digits, ``.``, ``_``, ``-``).
        width: The window's width in CSS pixels.
        height: The window's height: the picture shows this much of the page.

    Raises:
        FileNotFoundError: When there is no such page.
        ValueError: For an artifact name that is not a plain file name.
    """
    page = pathlib.Path(html_path)
    if not page.is_file():
        raise FileNotFoundError(f"no such page: {page}")
    if not _ARTIFACT.fullmatch(artifact):
        raise ValueError(f"artifact {artifact!r}: want a plain file name (letters, digits, '.', '_', '-')")
    executable = chromium_or_skip()
    png = artifacts_dir().resolve() / f"{artifact}.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)  # no picture of an earlier run passes for this one's
    with tempfile.TemporaryDirectory(prefix="lp-chromium-", ignore_cleanup_errors=True) as profile:
        command = chromium.chromium_command(
            executable, page, profile=pathlib.Path(profile), screenshot=png, width=width, height=height, extra=LOGGING
        )
        try:
            done = chromium.run_chromium(command)
        except subprocess.TimeoutExpired as timeout:
            pytest.fail(
                f"Chromium did not finish {page} within {timeout.timeout:.0f} s; its log ended with:\n"
                + _tail(timeout.stderr)
            )
    if done.returncode != 0 or "<html" not in done.stdout or not png.is_file():
        pytest.fail(
            f"Chromium exited with {done.returncode} on {page} (DOM: {len(done.stdout)} characters, picture:"
            f" {'written' if png.is_file() else 'missing'}); its log ended with:\n{_tail(done.stderr)}"
        )
    return Rendered(dom=done.stdout, console=console_messages(done.stderr), screenshot=png)


def console_messages(log: str) -> list[str]:
    """The console messages in Chromium's log ``log``, in order, each as the page wrote it (line breaks kept,
    without Chromium's ``", source: url (line)`` suffix)."""
    lines = log.splitlines()
    messages = []
    i = 0
    while i < len(lines):
        start = _CONSOLE.match(lines[i])
        i += 1
        if not start:
            continue
        parts = [start.group(1)]
        # A message ends on the line that ends with its source; a line break in it continues it on the next
        # lines, up to that one (or, were its end lost, up to the next log line).
        while not _SOURCE.match(parts[-1]) and i < len(lines) and not _LOG_LINE.match(lines[i]):
            parts.append(lines[i])
            i += 1
        text = "\n".join(parts)
        whole = _SOURCE.match(text)
        messages.append(whole.group(1) if whole else text)
    return messages


def _tail(text: str | bytes | None, lines: int = 30) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-lines:]) or "(nothing)"
