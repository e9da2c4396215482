"""Entry point of `nvsharectl` (pyproject: nvshare_cli.__main__:main)."""

from .app import app


def main() -> None:
    app(prog_name="nvsharectl")


if __name__ == "__main__":
    main()
