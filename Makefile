# The two commands that do all set-up on a fresh machine:
#   make demo   # a real training run with PerfCallback, then the `tensorboard --logdir ...` line
#   make test   # the lint, format and type checks, then the test suite (what .ci/run calls); installs
#               # headless Chromium for the browser tests where it is missing (`make browser`)
# and, while working:
#   make lint   # ruff check, ruff format --check and mypy (settings in pyproject.toml), all three reported
#   make format # applies ruff's fixes and its formatting to the tree
#   make screenshot # a fresh demo run, then the README's picture of its report page (docs/report-page.png)
#   make docs   # the documentation site, built offline with warnings as errors into site/ (open site/index.html)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet -c constraints.txt

.PHONY: demo test lint format install browser screenshot docs clean

$(VENV)/.base: constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned to the CPU build on this disk: nothing later may pull a different (CUDA) build.
	$(PIP) torch==2.13.0
	touch $@

$(VENV)/.demo: $(VENV)/.base pyproject.toml
	$(PIP) -e '.[demo]'
	touch $@

$(VENV)/.test: $(VENV)/.base pyproject.toml
	$(PIP) -e '.[test]'
	touch $@

$(VENV)/.docs: $(VENV)/.base pyproject.toml
	$(PIP) -e '.[docs]'
	touch $@

install: $(VENV)/.test

demo: $(VENV)/.demo
	$(PY) examples/demo.py

# Each check runs even when one before it failed, so one run lists every problem; any failure fails the target.
lint: $(VENV)/.test
	status=0; \
	$(PY) -m ruff check . || status=1; \
	$(PY) -m ruff format --check . || status=1; \
	$(PY) -m mypy || status=1; \
	exit $$status

format: $(VENV)/.test
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Headless Chromium for the tests that open the HTML pages (tests/browser.py): Debian's `chromium`, installed
# with apt-get when missing (through sudo when not root), the package lists refreshed only if the first try
# fails. Without apt-get it says so and goes on: those tests then skip, or fail where CI is set.
SUDO = $(shell [ "$$(id -u)" = 0 ] || command -v sudo)
browser:
	@command -v chromium >/dev/null || { \
	  command -v apt-get >/dev/null || { echo "No chromium and no apt-get: install Chromium to run the browser tests."; exit 0; }; \
	  echo "Installing chromium (Debian's package) for the browser tests"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium \
	  || { $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }; \
	}

# pytest's own exit code fails the target, 5 ("no tests collected") included.
test: lint browser
	$(PY) -m pytest $(PYTEST_ARGS)

# The site (mkdocs.yml, docs/): --strict turns every warning (a broken link or anchor, a page left out of the nav)
# into an error, and docs/hooks.py fails it where a rule, threshold, CLI flag or report field has no text.
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# The README's picture of a run's report page, made by the project: the demo in a fresh directory, then its
# report.html in headless Chromium (examples/report_screenshot.py).
SCREENSHOT_RUN := demo_logs/screenshot
screenshot: $(VENV)/.demo browser
	rm -rf $(SCREENSHOT_RUN)
	$(PY) examples/demo.py --root $(SCREENSHOT_RUN)
	page=$$(find $(SCREENSHOT_RUN) -name report.html | head -1); \
	test -n "$$page" || { echo "The demo wrote no report.html under $(SCREENSHOT_RUN)" >&2; exit 1; }; \
	$(PY) examples/report_screenshot.py "$$page" docs/report-page.png --width 1280 --height 3000

clean:
	rm -rf $(VENV) lightning_logs demo_logs ddp_logs before_after_logs test-artifacts .pytest_cache .ruff_cache \
	  .mypy_cache site
