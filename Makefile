# Top-level entry points; each part builds in its own folder.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

# The C that clang-format keeps in shape, and the shim's sources for clang-tidy.
C_FILES := $(wildcard shim/*.[ch] tests/standin/*.[ch] tests/gpu/*.c)
SHIM_SOURCES := $(wildcard shim/*.c)
SHIM_TIDY_FLAGS := -std=gnu11 -O2 -pthread -D_GNU_SOURCE -include shim/glibc_baseline.h -Ishim
# mypy reads the packages under their installed names: the folders agent/,
# cli/, device_plugin/ and metrics/ are nvshare_agent, nvshare_cli,
# nvshare_device_plugin and nvshare_metrics (pyproject.toml), so link them so.
TYPECHECK_ROOT := build/typecheck

.PHONY: all shim shim-asan standin wire-cache deps build-deps lint-deps venv lint-venv lint format check check-fast check-clean deb install clean

all: shim

# The C parts need a compiler, which `make install` takes away again with the
# other build tools it brought: say so in one line rather than `cc: No such file`.
NEED_CC = @command -v $(firstword $(CC)) >/dev/null 2>&1 || { echo "nvshare: make $@ needs a C compiler ($(firstword $(CC)) is missing; make install removed the build tools it brought): sudo apt-get install gcc make" >&2; exit 1; }

# check-fast spreads its C builds over the cores (6.8 s one file at a time on 2 cores,
# 3.4 s spread), unless make was given -j itself; other targets build one file at a time
# (CI runs make check's stages side by side, and their timing tests feel the bursts).
BUILD_JOBS =
SPREAD = $(if $(findstring -j,$(MAKEFLAGS)),,-j$(shell nproc))

shim:
	$(NEED_CC)
	$(MAKE) $(BUILD_JOBS) -C shim

# libnvshare.so built with AddressSanitizer (shim/build/address/), for tests/shim.
shim-asan:
	$(NEED_CC)
	$(MAKE) $(BUILD_JOBS) -C shim SANITIZE=address

# The stand-in libcuda.so.1 and the small C clients: test fixtures only.
standin:
	$(NEED_CC)
	$(MAKE) $(BUILD_JOBS) -C tests/standin

# System packages the build and the tests need (Debian 12); a no-op when present.
# What it installs is recorded outside the checkout (make clean keeps it, and
# another checkout's make check adds to it), for make check-clean.
CHECK_BROUGHT := /var/cache/nvshare-ci/check-deps-brought.txt
deps:
	packaging/install-deps.sh --record $(CHECK_BROUGHT) deps-build.txt deps-test.txt

# Takes away what make check left on the node: the Debian packages that make deps
# installed, with what they pulled in (those nothing else installed needs: what
# nvshare needs stays, marked automatic, until apt purge nvshare and apt
# autoremove), and the test containers' roots.  The venv and the build outputs are
# the checkout's (make clean).
check-clean:
	@if [ -s $(CHECK_BROUGHT) ]; then packaging/remove-brought.sh $(CHECK_BROUGHT); fi
	rm -rf $(dir $(CHECK_BROUGHT))

# What building the .deb needs, and only that, marked automatically installed, so
# that `apt autoremove` removes them.  (make install brings them itself, and takes
# those it brought away again once the .deb is installed.)
build-deps:
	packaging/install-deps.sh --auto deps-build.txt

lint-deps:
	packaging/install-deps.sh deps-lint.txt

$(VENV)/.installed: pyproject.toml tests/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

$(VENV)/.lint-installed: $(VENV)/.installed tests/requirements-lint.txt
	$(PY) -m pip install -q --disable-pip-version-check -r tests/requirements-lint.txt
	touch $@

venv: $(VENV)/.installed

lint-venv: $(VENV)/.lint-installed

# Formatting, lint, types and the shim's static checks; changes nothing.
lint: lint-deps lint-venv shim
	$(PY) -m ruff format --check --quiet .
	$(PY) -m ruff check --quiet .
	mkdir -p $(TYPECHECK_ROOT)
	ln -sfn ../../agent $(TYPECHECK_ROOT)/nvshare_agent
	ln -sfn ../../cli $(TYPECHECK_ROOT)/nvshare_cli
	ln -sfn ../../device_plugin $(TYPECHECK_ROOT)/nvshare_device_plugin
	ln -sfn ../../metrics $(TYPECHECK_ROOT)/nvshare_metrics
	cd $(TYPECHECK_ROOT) && ../../$(PY) -m mypy --config-file ../../pyproject.toml -p nvshare_agent -p nvshare_cli -p nvshare_device_plugin -p nvshare_metrics
	clang-format --dry-run --Werror $(C_FILES)
	clang-tidy --quiet $(SHIM_SOURCES) -- $(SHIM_TIDY_FLAGS)
	$(PY) tools/check_shim_layers.py

# Rewrites the files lint would complain about, where a tool can.
format: lint-venv
	$(PY) -m ruff format --quiet .
	$(PY) -m ruff check --quiet --fix .
	clang-format -i $(C_FILES)

# cffi's parse of the wire format, made once for the checkout's agents (tools/wire_cache.py:
# each start would parse the header again, ~20 ms; tests start hundreds).
wire-cache: agent/_wire_ffi.py
agent/_wire_ffi.py: shim/nvshare_protocol.h tools/wire_cache.py
	@test -x $(PY) || { echo "wire-cache: no $(VENV); run 'make venv' once (it needs the network)" >&2; exit 1; }
	$(PY) tools/wire_cache.py $@

# The whole suite.  pytest exits 5 when it collects nothing, which fails here too.
# Run as root in someone's checkout, what it built there goes back to them,
# whatever the outcome.
check: deps
	@status=0; \
	$(MAKE) shim shim-asan standin venv && $(MAKE) wire-cache && $(PY) -m pytest $(PYTEST_ARGS) || status=$$?; \
	packaging/give-back-checkout.sh; exit $$status

# The inner loop: no root, no network, no containers, about a minute on 2 cores.
# Builds the shim and the stand-in (gcc only); the venv must exist (make venv, or
# make check, once: that needs the network).  Eight workers on 2 cores, each taking the
# next test as it finishes (worksteal): most tests wait on processes or timeouts (212 s
# of tests, ~65 s of CPU), and a long one no longer ends a run alone (44 s with 5; 39 s).
# Bytecode is written (git-ignored __pycache__), even where PYTHONDONTWRITEBYTECODE is
# set: the run starts ~450 Python processes (175 agents), and each compiled the agent
# anew.  Not under a PYTHONPYCACHEPREFIX: there the standard library's and the venv's
# installed bytecode is not found either (a first run took 8 s more than the next; 3 now).
CHECK_FAST_MARKERS := not slow and not root and not container
CHECK_FAST_WORKERS := 8
PYCACHE := PYTHONDONTWRITEBYTECODE=
check-fast:
	@test -x $(PY) || { echo "check-fast: no $(VENV); run 'make venv' once (it needs the network)" >&2; exit 1; }
	@$(MAKE) --no-print-directory BUILD_JOBS="$(SPREAD)" shim shim-asan standin wire-cache
	$(PYCACHE) $(PY) -m pytest -q -rfE -n $(CHECK_FAST_WORKERS) --dist worksteal -m "$(CHECK_FAST_MARKERS)" $(PYTEST_ARGS)

deb:
	$(MAKE) -C packaging deb

# Fresh Debian 12 machine: build the .deb and install it (socket listening, preload
# on), remove the build tools it installed for that, then say so.  The test tools
# are make check's.
install:
	@status=0; packaging/install.sh || status=$$?; packaging/give-back-checkout.sh; exit $$status

clean:
	$(MAKE) -C shim clean
	$(MAKE) -C tests/standin clean
	rm -rf build $(VENV) agent/_wire_ffi.py
	find agent bench cli device_plugin metrics tests tools -name __pycache__ -prune -exec rm -rf {} +
