#!/usr/bin/env python3
"""Writes agent/_wire_ffi.py: cffi's parse of the wire format, made once (`make`).

    tools/wire_cache.py [OUTPUT]

agent/wire_layout.py hands the header's text between its markers to ffi.cdef at
every start, which costs ~20 ms a process in pycparser; tests start hundreds.
This writes cffi's out-of-line form of that parse with the text itself:
wire_layout uses it only where that is the text of the header it reads, and
parses the header itself otherwise.  The header stays the one definition; the
file is a cache, ignored by git and left out of the package.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import sys
import tempfile

import cffi

from nvshare_agent.wire_layout import wire_format_text

REPO = pathlib.Path(__file__).resolve().parents[1]


def write(output: pathlib.Path) -> None:
    text = wire_format_text()  # as the agent reads it: the one reading of the header
    builder = cffi.FFI()
    builder.cdef(text)
    builder.set_source("nvshare_agent._wire_ffi", None)
    with tempfile.TemporaryDirectory() as scratch:
        made = pathlib.Path(scratch) / "made.py"
        with contextlib.redirect_stdout(io.StringIO()):  # its "generating ..." line
            builder.emit_python_code(str(made))
        code = made.read_text()
    code += f"\n# The wire format text this was made from.\nWIRE_FORMAT = {text!r}\n"
    # Whole or not at all: a file cut short (a full disk) would be newer than the
    # header, and make would keep it.
    partial = output.with_name(output.name + ".partial")
    partial.write_text(code)
    os.replace(partial, output)


if __name__ == "__main__":
    write(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "agent" / "_wire_ffi.py")
