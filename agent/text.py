"""Text that peers send (a shim's command line, a D-Bus caller's argument) made
safe to log and to show."""


def printable(text: str) -> str:
    """text with control and other non-printable characters replaced: in our log a
    newline would forge a line, on an admin's terminal an escape code would drive it."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "\ufffd" for c in text)


def excerpt(value, limit: int = 64) -> str:
    """repr(value), cut to about `limit` characters: an error that quotes a
    caller's argument must not grow with it (a 20 MB argument quoted whole makes
    a reply too large for the bus, and dbus-daemon drops the sender)."""
    if isinstance(value, str) and len(value) > limit:
        quoted = repr(value[:limit])  # cut first: repr doubles every backslash
        return f"{quoted[:-1]}...{quoted[-1]} ({len(value)} characters)"
    quoted = repr(value)
    return quoted if len(quoted) <= limit else quoted[:limit] + "..."
