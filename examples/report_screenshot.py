"""
A report page's screenshot
==========================

The README's picture of a run's HTML report, made by the project itself: headless Chromium (Debian's
``chromium`` package) opens the page from ``file://`` with the network blocked, lets its scripts draw the
charts, and saves what a window of the given size shows as a PNG::

    python examples/report_screenshot.py demo_logs/lightning_logs/version_0/perf/report.html out.png \
        [--width 1280] [--height 2000]

``make screenshot`` runs the demo and writes ``docs/report-page.png`` this way.

The tests open pages the same way: ``tests/browser.py`` loads this file and builds its command line with
:func:`chromium_command` (adding the DOM dump and the console log), so that how Chromium is driven is said
once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

EXECUTABLE = "chromium"
"""Debian's package and command (``apt-get install chromium``)."""

HEADLESS = (
    "--headless",  # Chromium's new headless mode (the real browser, no window), the only one since 132
    "--no-sandbox",  # its sandbox refuses to start as root, which CI containers are
    "--disable-gpu",
    "--disable-dev-shm-usage",  # Docker's /dev/shm is 64 MB; Chromium crashes when it fills
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
"""What a headless Chromium needs to start anywhere, root in a container included, without calling home."""

OFFLINE = (
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
)
"""The network blocked whatever the page asks, twice over: every host, an address or this machine's loopback
included, resolves to nothing; and every connection, loopback included, goes through a proxy on port 9
(discard), where nothing listens. Either alone stops every fetch (tried against a server on the loopback);
both stay so that no single change in Chromium opens the network. A fetch fails at once instead of waiting."""

VIRTUAL_TIME_BUDGET_MS = 5000
"""How long, in the page's virtual time, its scripts run before Chromium takes the DOM and the picture.
Chromium fast-forwards timers while the page is idle, so this costs no wall time; Plotly draws a page of
charts in well under a second of it."""

TIMEOUT_S = 60
"""Wall-clock limit of one Chromium run: a page with a dozen charts takes 1-4 s on two shared cores."""


def chromium_command(
    executable: str,
    page: Path,
    *,
    profile: Path,
    screenshot: Path,
    width: int,
    height: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line that opens ``page`` offline and writes a ``width`` x ``height`` picture of it to
    ``screenshot`` once its scripts have run.

    Args:
        executable: Chromium's path.
        page: The HTML file.
        profile: An empty directory for Chromium's profile (one per run: two runs must not share one).
        screenshot: Where the PNG goes.
        width: The window's width, in CSS pixels.
        height: The window's height: the picture shows this much of the page from its top.
        extra: More switches (the tests add ``--dump-dom`` and the console log).
    """
    return [
        executable,
        *HEADLESS,
        *OFFLINE,
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}",
        f"--screenshot={screenshot}",
        *extra,
        page.resolve().as_uri(),
    ]


def run_chromium(command: Sequence[str], *, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` to its end, its output and errors captured as text. Chromium's helper processes
    (renderer, GPU, zygote) share its new process group, so that on a timeout all of them are killed.

    Raises:
        subprocess.TimeoutExpired: After ``timeout`` seconds, with what Chromium wrote by then.
    """
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def screenshot(page: Path, out: Path, *, width: int = 1280, height: int = 2000) -> None:
    """Writes the picture of ``page`` to ``out`` (its directory made when missing).

    Raises:
        FileNotFoundError: When ``page`` or Chromium is missing.
        RuntimeError: When Chromium fails or writes no picture; the message ends with its errors.
    """
    if not page.is_file():
        raise FileNotFoundError(f"no such page: {page}")
    executable = shutil.which(EXECUTABLE)
    if executable is None:
        raise FileNotFoundError(f"`{EXECUTABLE}` not found: install it (Debian/Ubuntu: apt-get install chromium)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="report-screenshot-", ignore_cleanup_errors=True) as profile:
        command = chromium_command(
            executable, page, profile=Path(profile), screenshot=out.resolve(), width=width, height=height
        )
        done = run_chromium(command)
    if done.returncode != 0 or not out.is_file():
        tail = "\n".join(done.stderr.splitlines()[-20:])
        raise RuntimeError(f"Chromium exited with {done.returncode} and wrote no {out}; its errors ended with:\n{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A PNG of an HTML report page, drawn by headless Chromium offline.")
    parser.add_argument("page", type=Path, help="the report page (report.html)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1280, help="the window's width in CSS pixels (default 1280)")
    parser.add_argument("--height", type=int, default=2000, help="the window's height (default 2000)")
    args = parser.parse_args(argv)
    try:
        screenshot(args.page, args.out, width=args.width, height=args.height)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"report_screenshot: {error}", file=sys.stderr)
        return 1
    print(f"Wrote {args.out} ({args.width} x {args.height} of {args.page})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
