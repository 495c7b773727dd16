# The two commands that do all set-up on a fresh machine:
#   make demo   # a real training run with PerfCallback, then the `tensorboard --logdir ...` line
#   make test   # the lint, format and type checks, then the test suite (what .ci/run calls)
# and, while working:
#   make lint   # ruff check, ruff format --check and mypy (settings in pyproject.toml), all three reported
#   make format # applies ruff's fixes and its formatting to the tree
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet -c constraints.txt

.PHONY: demo test lint format install clean

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

# pytest's own exit code fails the target, 5 ("no tests collected") included.
test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) lightning_logs demo_logs ddp_logs before_after_logs .pytest_cache .ruff_cache .mypy_cache
