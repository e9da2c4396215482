"""argparse for the node's small commands (the device plugin, the metrics exporter):
bad usage is one line on stderr, naming --help, and exit status 2."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
