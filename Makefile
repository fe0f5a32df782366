# hwtrace: the two commands a user needs are `make demo` and `make test`.
# Both set everything up themselves: a virtual environment in .venv and,
# where we are root and apt-get exists, the optional Debian test oracles.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUNTIME := $(VENV)/.runtime
CONFORMANCE ?= ../shared/conformance/libipt

.PHONY: all venv oracles demo test lint format conformance docs bench bench-overhead clean

all: venv

# The runtime: what `make demo` needs.  The decoders' compiled loops are
# built into the native library (hwtrace.aot) after a first use anyway;
# here the ones the demo's commands call are, so that they start fast.
# Where $(PYTHON)'s own pip can install into another interpreter (pip
# 22.3's --python), the runtime's venv is made without a pip of its own:
# ensurepip and an upgrade of pip are ~7 s of a first run.  The
# development set-up gives the venv its pip.
HOST_PIP := $(shell $(PYTHON) -c "import pip, sys; sys.exit(tuple(map(int, pip.__version__.split('.')[:2])) < (22, 3))" 2>/dev/null && echo yes)
PIP_RUNTIME := $(if $(HOST_PIP),$(PYTHON) -m pip --python $(BIN)/python,$(BIN)/pip)

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(if $(HOST_PIP),--without-pip) $(VENV)
	$(if $(HOST_PIP),,$(BIN)/pip install --quiet --upgrade pip)
	@# (no bytecode for every module of every dependency: the warm-up
	@# writes it for the modules the commands import)
	$(PIP_RUNTIME) install --quiet --no-compile -e .
	-$(BIN)/hwtrace aot warm --parts library,perf,record
	touch $(RUNTIME)

# Development: test and documentation tools, and every command warmed.
# Where the runtime is not set up yet, it is set up with them: one
# install, one warm-up of every command (the runtime's among them) and one
# build of the native library instead of two of each.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(BIN)/pip || $(BIN)/python -m ensurepip --upgrade --default-pip > /dev/null
	@# (pip writes the bytecode of what it installs in one process; here
	@# every CPU writes it: tests import more than the commands do)
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	-$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null
	-$(BIN)/hwtrace aot warm
	@# ... and the numba caches it left kept by the tests' first run.
	$(BIN)/python tests/numba_caches.py
	touch $(RUNTIME) $(STAMP)

venv: $(STAMP)

# Intel's decoder (libipt) and perf are oracles and benchmark peers, never
# runtime requirements: install them when we can, tests skip when absent.
oracles:
	@bash scripts/install-oracles.sh

# The main job: build a small C program, record one of its functions with
# whatever backend this machine has (perf + Intel PT, else code patching),
# decode it and report.
DEMO := build/demo
demo: $(RUNTIME)
	@mkdir -p build
	gcc -O2 -g -o $(DEMO) examples/demo/demo.c
	$(BIN)/hwtrace record -o build/demo.data -f checksum -f digest -f mix -f by_value -- $(DEMO) 24
	$(BIN)/hwtrace report -i build/demo.data --folded build/demo.folded
	@echo "--- first instructions (hwtrace script):"
	@$(BIN)/hwtrace script -i build/demo.data | head -8

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	@# The package layers (pyproject.toml's [tool.importlinter]): imports only go down.
	$(BIN)/lint-imports --no-cache --no-logo

format: venv
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

conformance: venv
	$(BIN)/python $(CONFORMANCE)/run.py ptdump --suite core --cmd "$(BIN)/hwtrace ptdump"

# The documentation site (mkdocs.yml): guides from docs/, the command and
# Python API reference generated from the code (docs/hooks/reference.py).
# `make test` builds it in strict mode (tests/package/test_docs.py).
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The suite runs on TEST_WORKERS processes (pytest-xdist), a test file
# each at a time: its module fixtures (programs built, traces recorded)
# are made once, and the files that share kernel state name theirs apart.
# The longest files go first (tests/conftest.py's LONG_FILES).
TEST_WORKERS ?= 2
test: venv oracles lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: venv oracles
	$(BIN)/python bench/bench_packets.py
	$(BIN)/python bench/bench_startup.py
	$(BIN)/python bench/bench_flow.py
	$(BIN)/python bench/bench_decode.py
	$(BIN)/python bench/bench_script.py
	$(BIN)/python bench/bench_parquet.py
	$(BIN)/python bench/bench_latency.py
	$(BIN)/python bench/bench_perf_memory.py
	$(BIN)/python bench/bench_stepping.py
	$(BIN)/python bench/bench_filter.py
	$(BIN)/python bench/bench_lttng.py
	$(BIN)/python bench/bench_kernel_filter.py
	$(BIN)/python bench/bench_jitcapture.py
	$(BIN)/python bench/bench_vm.py
	$(BIN)/python bench/bench_channel.py

# Recording overhead against valgrind and Frida (tens of minutes: lackey's
# superblock trace runs at ~600x; BENCH_ARGS=--quick for a short run).
bench-overhead: venv
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/bench_overhead.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache .ruff_cache bench/out
