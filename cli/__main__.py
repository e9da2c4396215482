"""Entry point of `nvsharectl` (pyproject: nvshare_cli.__main__:main)."""

import sys

import click
import typer

from .app import app


def main() -> None:
    command = typer.main.get_command(app)
    try:
        exit_code = command.main(prog_name="nvsharectl", standalone_mode=False)
    except click.UsageError as error:
        # Click would print the usage, a hint and the error on four lines.
        where = error.ctx.command_path if error.ctx is not None else "nvsharectl"
        typer.echo(f"nvsharectl: {error.format_message().rstrip('.')}; see '{where} --help'", err=True)
        sys.exit(error.exit_code)
    except click.ClickException as error:
        typer.echo(f"nvsharectl: {error.format_message()}", err=True)
        sys.exit(error.exit_code)
    except click.Abort:
        typer.echo("nvsharectl: aborted", err=True)
        sys.exit(1)
    # A command that returned normally gives None; typer.Exit gives its code.
    sys.exit(exit_code if isinstance(exit_code, int) else 0)


if __name__ == "__main__":
    main()
