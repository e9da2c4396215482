"""Text that peers send (a shim's command line) made safe to log and to show."""


def printable(text: str) -> str:
    """text with control and other non-printable characters replaced: in our log a
    newline would forge a line, on an admin's terminal an escape code would drive it."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "\ufffd" for c in text)
