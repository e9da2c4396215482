"""The manual pages in docs/man/ render without a warning and keep up with the
programs: every command and option that nvsharectl, nvshare-agent,
nvshare-device-plugin and nvshare-metrics accept is named in its page, and every option a page
names is accepted.  The lists come from the programs themselves (click's
command tree, the others' --help), so a new option without a line in the page
fails here."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer.main

from nvshare_cli.app import app

REPO = Path(__file__).resolve().parents[1]
NVSHARECTL_PAGE = REPO / "docs/man/nvsharectl.1"
AGENT_PAGE = REPO / "docs/man/nvshare-agent.8"
DEVICE_PLUGIN_PAGE = REPO / "docs/man/nvshare-device-plugin.8"
METRICS_PAGE = REPO / "docs/man/nvshare-metrics.8"
PAGES = [NVSHARECTL_PAGE, AGENT_PAGE, DEVICE_PLUGIN_PAGE, METRICS_PAGE]
# An option as it appears in running text: not the "-Bus" of "D-Bus".
OPTION = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")

needs_groff = pytest.mark.skipif(
    not shutil.which("groff"), reason="needs groff (groff-base, packaging/deps-test.txt)"
)


def rendered(page: Path) -> str:
    """The page as plain text: ASCII hyphens, no overstriking, and lines so
    long that no option is broken across two."""
    result = subprocess.run(
        ["groff", "-man", "-Tascii", "-P-cbou", "-rLL=1000n", str(page)],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def sections(text: str) -> dict[str, str]:
    """Rendered text by section heading (NAME, SYNOPSIS, OPTIONS, ...)."""
    found, heading = {}, None
    for line in text.splitlines():
        if re.fullmatch(r"[A-Z][A-Z ]+", line):
            heading = line
            found[heading] = ""
        elif heading is not None:
            found[heading] += line + "\n"
    return found


def mentions(text: str, word: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text) is not None


def nvsharectl_tree() -> list[tuple[tuple[str, ...], list[click.Parameter]]]:
    """(command path, its parameters with the help option) for nvsharectl and
    each of its commands, as click sees them at run time."""
    found = []

    def walk(command: click.Command, path: tuple[str, ...], parent):
        ctx = command.make_context(
            " ".join(("nvsharectl",) + path), [], parent=parent, resilient_parsing=True
        )
        found.append((path, command.get_params(ctx)))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, path + (name,), ctx)

    walk(typer.main.get_command(app), (), None)
    return found


def help_options(module: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(OPTION.findall(result.stdout))


@needs_groff
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_page_renders_without_a_warning(page):
    result = subprocess.run(
        ["groff", "-k", "-man", "-ww", "-z", "-Tutf8", str(page)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    if shutil.which("man"):
        # What lintian runs (its "groff-message" check), at 80 columns.
        result = subprocess.run(
            ["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(page)],
            capture_output=True,
            text=True,
            check=False,
            env=dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="80"),
        )
        assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_page_title_is_its_file_name_and_section(page):
    title = re.search(r"^\.TH (\S+) (\d)\b", page.read_text(), re.MULTILINE)
    assert title, f"{page.name} has no .TH line"
    assert (title[1].replace("\\-", "-").lower(), title[2]) == tuple(page.name.rsplit(".", 1))


@needs_groff
def test_nvsharectl_page_names_every_command_option_and_choice():
    text = rendered(NVSHARECTL_PAGE)
    commands = sections(text)["COMMANDS"]
    missing = []
    for path, params in nvsharectl_tree():
        if path and not mentions(commands, " ".join(path)):
            missing.append(" ".join(path))
        for param in params:
            words = param.opts + param.secondary_opts if isinstance(param, click.Option) else []
            words += list(getattr(param.type, "choices", None) or [])
            missing += [f"{' '.join(path)}: {word}" for word in words if not mentions(text, word)]
    assert missing == [], f"not in {NVSHARECTL_PAGE.name}: {missing}"


@needs_groff
def test_nvsharectl_page_names_no_option_that_nvsharectl_lacks():
    accepted = {
        opt
        for _, params in nvsharectl_tree()
        for param in params
        if isinstance(param, click.Option)
        for opt in param.opts + param.secondary_opts
    }
    page = sections(rendered(NVSHARECTL_PAGE))
    named = set(OPTION.findall(page["SYNOPSIS"] + page["OPTIONS"]))
    assert named and named <= accepted, f"unknown to nvsharectl: {sorted(named - accepted)}"


@needs_groff
@pytest.mark.parametrize(
    "page, module, some_options",
    [
        (AGENT_PAGE, "nvshare_agent", {"--help", "--socket", "--debug"}),
        (DEVICE_PLUGIN_PAGE, "nvshare_device_plugin", {"--help", "--replicas", "--version"}),
        (METRICS_PAGE, "nvshare_metrics", {"--help", "--timeout", "--bus"}),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else None,
)
def test_page_names_exactly_the_options_of_its_help(page, module, some_options):
    accepted = help_options(module)
    assert some_options <= accepted  # the help output still parses
    text = sections(rendered(page))
    named = set(OPTION.findall(text["SYNOPSIS"] + text["OPTIONS"]))
    assert accepted - named == set(), f"not in {page.name}: {sorted(accepted - named)}"
    assert named - accepted == set(), f"unknown to {module}: {sorted(named - accepted)}"


@needs_groff
def test_agent_page_names_every_variable_the_shim_reads():
    config = (REPO / "shim/config.c").read_text()
    variables = set(re.findall(r"\b(?:secure_getenv|read_flag|read_count)\(\"(\w+)\"", config))
    assert "NVSHARE_SOCKET" in variables  # the pattern still finds them
    environment = sections(rendered(AGENT_PAGE))["ENVIRONMENT"]
    missing = sorted(name for name in variables if not mentions(environment, name))
    assert missing == [], f"not in {AGENT_PAGE.name}'s ENVIRONMENT: {missing}"


def test_the_package_installs_every_page():
    listed = (REPO / "packaging/debian/nvshare.manpages").read_text().split()
    assert sorted(listed) == sorted(str(page.relative_to(REPO)) for page in PAGES)
    assert sorted(REPO.glob("docs/man/*")) == sorted(PAGES)
