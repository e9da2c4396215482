"""The device plugin as a process, for tests/device_plugin (conftest.py makes
the fixtures) and for tests elsewhere that import it the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_NVML = REPO / "tests/agent/fake_nvml"
H100 = "GPU-0d84ee44-b797-1c71-8ccd-cefec22161de"
L4 = "GPU-11111111-2222-3333-4444-555555555555"


class PluginProcess:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log_path = log
        with open(log, "wb") as log_file:
            self.process = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 10) -> str:
        """The log once it holds text (the plugin writes its log every 20 ms)."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not in the plugin's log: {self.log()[-2000:]}")
            time.sleep(0.02)
        return self.log()

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def plugin_env(hidden_gpus_file: Path, fake_nvml_mode: str = "two-gpus") -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]),
        FAKE_NVML=fake_nvml_mode,
        FAKE_NVML_HIDDEN=str(hidden_gpus_file),
    )
