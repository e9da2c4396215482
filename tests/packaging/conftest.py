"""tests/packaging: the .deb in a booted bookworm container, and the
/etc/ld.so.preload editing.  Run alone with `pytest -m packaging`."""

import time

import pytest
from bookworm_container import skip_unless_containers_boot

_STAGES: list[tuple[str, float]] = []


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "packaging: the Debian package and its install in a booted bookworm container"
    )


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/packaging/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.packaging)


class StageClock:
    """Records how long each stage of the install test took; printed at the end."""

    def __call__(self, name: str):
        return _Stage(name)


class _Stage:
    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.began = time.monotonic()
        return self

    def __exit__(self, *exc):
        _STAGES.append((self.name, time.monotonic() - self.began))
        return False


@pytest.fixture(scope="session")
def bootable():
    """Skips, saying why, where systemd-nspawn cannot boot a container (inside an
    unprivileged container, say); before anything slow is built for one."""
    skip_unless_containers_boot()


@pytest.fixture(scope="session")
def stage():
    return StageClock()


def pytest_terminal_summary(terminalreporter):
    if not _STAGES:
        return
    terminalreporter.section("packaging stage times")
    for name, seconds in _STAGES:
        terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
    terminalreporter.write_line(f"{sum(s for _, s in _STAGES):7.1f} s  total")
