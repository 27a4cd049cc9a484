# Autograd & the Mathematics of Distributed Training: the two commands.
#   make lab    install (first run only) and open the course in JupyterLab
#   make test   install (first run only) and run the whole test suite
#   make hub    the course for a class: JupyterHub, exchange, PostgreSQL gradebook, grading queue
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
TORCH_VERSION := 2.13.0
# torch is pinned and installed first, as a CPU build by default. On Linux the CPU build comes
# from PyTorch's own wheel index (the default Linux wheel is the multi-GB CUDA build); macOS
# wheels are CPU builds already. For a CUDA build: make clean-venv && make install TORCH_VARIANT=cu128
TORCH_VARIANT ?= cpu
ifeq ($(shell uname -s),Darwin)
TORCH_SPEC := torch==$(TORCH_VERSION)
TORCH_INDEX_ARGS :=
else
TORCH_SPEC := torch==$(TORCH_VERSION)+$(TORCH_VARIANT)
TORCH_INDEX_ARGS := --extra-index-url https://download.pytorch.org/whl/$(TORCH_VARIANT)
endif
PORT ?= 8888
export PATH := $(abspath $(BIN)):$(PATH)

ASSIGNMENT ?= check_yourself
WORKERS ?= 2

.PHONY: install lab test lint bench grade release sandbox clean-venv hub-install hub-setup hub worker

# The course library is installed editable, so pip compiles none of its bytecode, and where
# writing bytecode is off (PYTHONDONTWRITEBYTECODE) every interpreter that imports it (kernels,
# sandboxes, rank launchers, graders) compiled it again: about 0.2 s of CPU each. Every target
# that installs compiles what changed since the last time (Python still checks each file's
# bytecode against its source).
install: $(VENV)/.installed
	@$(PY) -m compileall -q lib/src

$(VENV)/.installed: Makefile requirements.txt requirements.lock lib/pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11 or newer is needed, found " + sys.version'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	@# A wheel that pip's own configuration already provides (a local wheel folder) is used
	@# without going online; otherwise the pinned build comes from the index above.
	$(PY) -m pip install --quiet --no-index --no-deps "$(TORCH_SPEC)" 2>/dev/null \
	  || $(PY) -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX_ARGS)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" -r requirements.txt -c requirements.lock -e lib
	@# Every kernel of this environment explains a NameError after a kernel restart.
	mkdir -p $(VENV)/etc/ipython
	echo 'c.InteractiveShellApp.extensions = ["chainrule.course.restart_hint"]' > $(VENV)/etc/ipython/ipython_kernel_config.py
	$(BIN)/jupyter labextension list 2>&1 | grep -q "@jupyter/nbgrader"
	$(BIN)/jupyter labextension list 2>&1 | grep -q "@jupyter-widgets/jupyterlab-manager"
	touch $@

lab: install
	$(BIN)/jupyter lab --port=$(PORT) $(if $(filter 0,$(shell id -u)),--allow-root) course/00_start.ipynb

# The suite runs on TEST_PROCESSES processes (pytest-xdist); tests that share fixtures run in one
# (tests/conftest.py groups them). TEST_PROCESSES=0 runs it in this one.
TEST_PROCESSES ?= 3

test: install
	$(PY) -m pytest $(if $(filter 0,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES))

lint: install
	$(BIN)/ruff check lib tests benchmarks
	$(BIN)/ruff format --check lib tests benchmarks
	$(BIN)/mypy

bench: install
	$(PY) -m benchmarks.run --out BENCHMARKS.md

release: install
	$(BIN)/nbgrader generate_assignment $(ASSIGNMENT) --force

# Grading runs every kernel in a bubblewrap sandbox: install it where we can (Debian or Ubuntu,
# as root); elsewhere the batch grader says what to install, or grade with --no-sandbox.
sandbox:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } || true

grade: install sandbox
	$(PY) -m chainrule.grading batch $(ASSIGNMENT) --workers $(WORKERS) $(GRADE_ARGS)

clean-venv:
	rm -rf $(VENV)

# -- The course for a class (README: "The course for a whole class") -------------------------------
# Debian's PostgreSQL and Redis, bubblewrap, and the hub's proxy (configurable-http-proxy, pinned in
# hub/package-lock.json), then the accounts, folders, exchange and gradebook of CLASS_ROOT (as root).
CLASS_ROOT ?= /srv/autograd-distributed
ROSTER ?= hub/roster.json
HUB_WORKERS ?= 2

hub-install: install sandbox
	@command -v redis-server >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	  || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql redis-server >/dev/null
	@command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
	test -x hub/node_modules/.bin/configurable-http-proxy || npm ci --prefix hub --no-audit --no-fund --loglevel=error

hub-setup: hub-install
	test -f $(CLASS_ROOT)/class.json || $(PY) -m chainrule.classroom setup --root $(CLASS_ROOT) --roster $(ROSTER)

hub: hub-setup
	$(PY) -m chainrule.classroom start --root $(CLASS_ROOT) --workers $(HUB_WORKERS)

# One grading worker (another machine: see the README), for CLASS_SETTINGS' course.
CLASS_SETTINGS ?= $(CLASS_ROOT)/class.json
worker: install sandbox
	$(PY) -m chainrule.classroom worker --settings $(CLASS_SETTINGS) $(WORKER_ARGS)
