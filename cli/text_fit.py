"""What nvsharectl's text is made of: sizes in words, and lines that fit the
terminal they are printed on (its real width; 80 columns when not a terminal)."""

import shutil
import sys

WIDTH = 80  # when stdout is not a terminal (a pipe, a file, a test)
MIN_WIDTH = 40  # below it, tables would be all "…"


def terminal_width(stream=None) -> int:
    """The width of the terminal stdout is on; WIDTH when it is not one."""
    stream = stream or sys.stdout
    try:
        if not stream.isatty():
            return WIDTH
    except (AttributeError, ValueError):  # closed, or no isatty
        return WIDTH
    columns = shutil.get_terminal_size((WIDTH, 24)).columns  # $COLUMNS first, as ls does
    return max(columns, MIN_WIDTH)


def fit(line: str, width: int = WIDTH) -> str:
    """The line, cut to width with an ellipsis where it is longer."""
    return line if len(line) <= width else line[: width - 1] + "…"


def size(num_bytes: int) -> str:
    amount = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def limit_text(num_bytes: int) -> str:
    return size(num_bytes) if num_bytes else "none"
