# Top-level entry points; each part builds in its own folder.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: all shim shim-asan standin deps venv check deb install clean

all: shim

shim:
	$(MAKE) -C shim

# libnvshare.so built with AddressSanitizer (shim/build/address/), for tests/shim.
shim-asan:
	$(MAKE) -C shim SANITIZE=address

# The stand-in libcuda.so.1 and the small C clients: test fixtures only.
standin:
	$(MAKE) -C tests/standin

# System packages the build and the tests need (Debian 12); a no-op when present.
deps:
	packaging/install-deps.sh

$(VENV)/.installed: pyproject.toml tests/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

venv: $(VENV)/.installed

# The whole suite.  pytest exits 5 when it collects nothing, which fails here too.
check: deps shim shim-asan standin venv
	$(PY) -m pytest $(PYTEST_ARGS)

deb:
	$(MAKE) -C packaging deb

# Fresh Debian 12 machine: build the .deb and install it (socket listening, preload on).
install: deps deb
	apt-get install -y ./build/nvshare_*.deb

clean:
	$(MAKE) -C shim clean
	$(MAKE) -C tests/standin clean
	rm -rf build $(VENV)
