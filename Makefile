# The two commands that do all set-up on a fresh machine:
#   make demo   # a real training run with PerfCallback, then the `tensorboard --logdir ...` line
#   make test   # the test suite (what .ci/run calls)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet -c constraints.txt

.PHONY: demo test install clean

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

test: $(VENV)/.test
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) lightning_logs demo_logs ddp_logs before_after_logs .pytest_cache
