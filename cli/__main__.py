"""Entry point of `nvsharectl` (pyproject: nvshare_cli.__main__:main)."""

import os
import sys

import click
import typer

from .app import app
from .client import EXIT_FAILED, EXIT_INTERRUPTED


def _one_line(text: str) -> str:
    # Click words some errors over several lines ("Choose from:\n\ton,\n\toff.").
    return " ".join(text.split())


def _os_error_line(error: OSError) -> str:
    if error.filename is None:
        # Every file and socket error is caught where it happens; one without
        # a file name is our output failing (a full disk, a closed terminal).
        return f"cannot write the output: {error.strerror or error}"
    name = getattr(error.filename, "value", error.filename)  # typer names shells by an enum
    line = f"{name}: {error.strerror or error}"
    if "--install-completion" in sys.argv[1:]:
        line = f"cannot install shell completion: {line}"
    return line


def _stop_writing_stdout() -> None:
    # What is still buffered for stdout would fail again at exit, with a
    # traceback-like "Exception ignored" message.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main() -> None:
    command = typer.main.get_command(app)
    try:
        exit_code = command.main(prog_name="nvsharectl", standalone_mode=False)
    except click.UsageError as error:
        # Click would print the usage, a hint and the error on four lines.
        where = error.ctx.command_path if error.ctx is not None else "nvsharectl"
        message = _one_line(error.format_message()).rstrip(".")
        typer.echo(f"nvsharectl: {message}; see '{where} --help'", err=True)
        sys.exit(error.exit_code)
    except click.ClickException as error:
        typer.echo(f"nvsharectl: {_one_line(error.format_message())}", err=True)
        sys.exit(error.exit_code)
    except click.Abort as error:
        if isinstance(error.__context__, KeyboardInterrupt):
            typer.echo("nvsharectl: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        typer.echo("nvsharectl: aborted", err=True)
        sys.exit(EXIT_FAILED)
    except OSError as error:
        # (A reader that stopped reading, EPIPE, click has already handled.)
        if error.filename is None:
            _stop_writing_stdout()
        typer.echo(f"nvsharectl: {_one_line(_os_error_line(error))}", err=True)
        sys.exit(EXIT_FAILED)
    # A command that returned normally gives None; typer.Exit gives its code.
    sys.exit(exit_code if isinstance(exit_code, int) else 0)


if __name__ == "__main__":
    main()
