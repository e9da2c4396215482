"""The agent's log: one key=value line per event, cheap enough for the hot path.

The logging module costs ~10-40 us per record (LogRecord, caller lookup, a
flush per record); the agent writes two lines per lock handoff and must do
thousands of handoffs a second on a small machine. So event lines are
formatted only when their level is on, buffered, and written with one os.write
at most every FLUSH_INTERVAL_S (a busy agent would otherwise pay a write
syscall per handoff; the price is that a crash may lose the last 20 ms).
Records from the logging module (other modules, libraries) go through the same
buffer via LoggingBridge, so the order of lines is kept.

Under systemd (JOURNAL_STREAM set) lines carry a <N> priority prefix, which
journald turns into the record's priority, and no timestamp (journald adds
it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
_NAMES = {
    DEBUG: "DEBUG",
    INFO: "INFO",
    WARNING: "WARNING",
    ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}
_SYSLOG_PRIORITY = {DEBUG: 7, INFO: 6, WARNING: 4, ERROR: 3, logging.CRITICAL: 2}
FLUSH_INTERVAL_S = 0.02


class EventLog:
    def __init__(self, fd: int = 2, level: int = INFO, journald: bool = False):
        self.configure(fd, level, journald)
        self._lines: list[str] = []
        self._second = -1
        self._second_text = ""

    def configure(self, fd: int = 2, level: int = INFO, journald: bool = False) -> None:
        self.fd, self.level, self.journald = fd, level, journald
        self.debug_enabled = level <= DEBUG
        self.info_enabled = level <= INFO

    def debug(self, fmt: str, *args) -> None:
        if self.debug_enabled:
            self.emit(DEBUG, fmt % args if args else fmt)

    def info(self, fmt: str, *args) -> None:
        if self.info_enabled:
            self.emit(INFO, fmt % args if args else fmt)

    def warning(self, fmt: str, *args) -> None:
        self.emit(WARNING, fmt % args if args else fmt)

    def error(self, fmt: str, *args) -> None:
        self.emit(ERROR, fmt % args if args else fmt)

    def emit(self, level: int, message: str) -> None:
        if level < self.level:
            return
        name = _NAMES.get(level, "INFO")
        if self.journald:
            line = f"<{_SYSLOG_PRIORITY.get(level, 6)}>{name} {message}\n"
        else:
            line = f"{self._timestamp()} {name} {message}\n"
        if not self._lines:
            try:
                asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)
            except RuntimeError:  # no loop (start-up, shutdown): write now
                self._lines.append(line)
                self.flush()
                return
        self._lines.append(line)

    def flush(self) -> None:
        if not self._lines:
            return
        data = "".join(self._lines).encode(errors="replace")
        self._lines.clear()
        while data:
            try:
                written = os.write(self.fd, data)
            except InterruptedError:
                continue
            except OSError:
                return  # nowhere to log to; the daemon must keep serving regardless
            data = data[written:]

    def _timestamp(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._second_text}.{int((now - second) * 1000):03d}"


class LoggingBridge(logging.Handler):
    """Routes logging-module records into the event log's buffer."""

    def __init__(self, events: EventLog):
        super().__init__()
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += " " + " | ".join(
                    logging.Formatter().formatException(record.exc_info).splitlines()
                )
            self.events.emit(record.levelno, " ".join(message.split("\n")))
        except Exception:
            self.handleError(record)


#: The agent's one event log; __main__ configures it.
events = EventLog()


def setup(debug: bool) -> None:
    """Send everything (event lines and logging records) to stderr."""
    level = DEBUG if debug else INFO
    events.configure(2, level, journald=bool(os.environ.get("JOURNAL_STREAM")))
    root = logging.getLogger()
    root.handlers[:] = [LoggingBridge(events)]
    root.setLevel(level)
