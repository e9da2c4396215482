"""A real Prometheus for the tests: Debian's package, unpacked (not installed: installing
starts a server on the node) into make check's cache, run on 127.0.0.1 with a config of
the test's, asked through its HTTP API."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

# make check's cache: make check-clean removes it (Makefile, CHECK_BROUGHT's folder).
CACHE = Path("/var/cache/nvshare-ci/prometheus")
BINARY = CACHE / "root/usr/bin/prometheus"
TIMEOUT_S = 30.0


def ensure_prometheus() -> Path:
    """Debian 12's prometheus binary, fetched once (apt-get download needs the network)."""
    if BINARY.exists():
        return BINARY
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob("*.deb"):
        old.unlink()
    # As root, apt warns that _apt cannot write here: the download is ours all the same.
    subprocess.run(
        ["apt-get", "download", "-q", "prometheus"],
        cwd=CACHE,
        check=True,
        capture_output=True,
        timeout=600,
    )
    (deb,) = CACHE.glob("prometheus_*.deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(CACHE / "root")], check=True, timeout=300)
    deb.unlink()
    return BINARY


def free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


class Prometheus:
    """One Prometheus scraping `target` (host:port) every `interval_s`."""

    def __init__(self, workdir: Path, target: str, interval_s: float = 1.0):
        self.workdir, self.target, self.interval_s = workdir, target, interval_s
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def start(self) -> Prometheus:
        binary = ensure_prometheus()
        config = self.workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {round(self.interval_s * 1000)}ms\n"
            f"  scrape_timeout: {round(self.interval_s * 1000)}ms\n"
            "scrape_configs:\n"
            "  - job_name: nvshare\n"
            "    static_configs:\n"
            f"      - targets: ['{self.target}']\n"
        )
        self.log_path = self.workdir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    str(binary),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    # The package's console files are not unpacked where it looks.
                    f"--web.console.templates={self.workdir}",
                    f"--web.console.libraries={self.workdir}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus stopped: {self.log()}")
            try:
                with urllib.request.urlopen(self._url("/-/ready"), timeout=1) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"prometheus not ready: {self.log()}")

    def _url(self, path: str, **query: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}" + (
            "?" + urllib.parse.urlencode(query) if query else ""
        )

    def query(self, expr: str) -> list[dict]:
        """The result of an instant query: [{"metric": {...}, "value"/"values": ...}]."""
        with urllib.request.urlopen(self._url("/api/v1/query", query=expr), timeout=10) as a:
            answer = json.load(a)
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=TIMEOUT_S)
