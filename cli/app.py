"""nvsharectl: watch and change the nvshare agent over D-Bus.

A thin client: parse, call, print.  Exit codes: 0 ok, 1 failed (agent not
running, permission denied, ...), 2 bad usage (including a value the agent
rejects).  The original nvsharectl's `-T SECONDS` and `-S on|off` still work
(and `-S auto`), node-wide.

`--gpu ID` changes one GPU's own settings: nvsharectl reads the agent's
GpuSettings map, changes that GPU's entry and writes the map back (the agent
checks it whole).  `reset --gpu ID` takes a GPU's own settings away.
"""

import asyncio
import enum
import json
import signal
from typing import Optional

import typer

from nvshare_agent.settings import SettingsError, parse_gpu_id, parse_size
from nvshare_agent.version import version

from . import render
from .client import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, CliError, connect
from .explain import explain as explain_pid
from .text_fit import terminal_width
from .top import watch

app = typer.Typer(
    help="Watch and change the nvshare GPU-sharing agent (over D-Bus).",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=False,
)
preload_app = typer.Typer(help="Turn the system-wide preload of libnvshare.so on or off.")
app.add_typer(preload_app, name="preload")


class Switch(str, enum.Enum):
    on = "on"
    off = "off"
    auto = "auto"


class OnOff(str, enum.Enum):
    on = "on"
    off = "off"


class GpuSetting(str, enum.Enum):
    """What `reset` takes away, by the name of its command."""

    time_quantum = "time-quantum"
    anti_thrash = "anti-thrash"
    memory_limit = "memory-limit"


# The key in GpuSettings behind each.
_GPU_SETTING_KEYS = {
    GpuSetting.time_quantum: "time_quantum_s",
    GpuSetting.anti_thrash: "anti_thrash",
    GpuSetting.memory_limit: "memory_limit_bytes",
}

GPU_OPTION = typer.Option(
    None,
    "--gpu",
    metavar="ID",
    show_default=False,
    help="Change this GPU's own setting instead of the node's: its UUID (GPU-...) or its "
    "NVML index (as nvidia-smi and status number them).",
)


# Accepted both before and after the command (`nvsharectl --json status`,
# `nvsharectl status --json`); the command's own value wins when given.
JSON_OPTION = typer.Option(None, "--json", help="Print JSON for scripts.", show_default=False)
BUS_OPTION = typer.Option(
    None,
    "--bus",
    metavar="ADDRESS",
    show_default=False,
    help="D-Bus address of the agent's bus (default: the system bus).",
)


class Options:
    def __init__(self, json_output: bool, bus: str):
        self.json_output = json_output
        self.bus = bus


def _options(ctx: typer.Context, json_output: Optional[bool], bus: Optional[str]) -> Options:
    parent: Options = ctx.find_object(Options) or Options(False, "system")
    return Options(
        parent.json_output if json_output is None else json_output,
        parent.bus if bus is None else bus,
    )


def _run(coroutine):
    try:
        return asyncio.run(coroutine)
    except CliError as error:
        typer.echo(f"nvsharectl: {error}", err=True)
        raise typer.Exit(error.exit_code) from None
    except KeyboardInterrupt:  # before click makes it "Aborted!" after an empty line
        typer.echo("nvsharectl: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _print_json(value) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


async def _status(options: Options, print_status: bool = True) -> dict:
    async with connect(options.bus) as client:
        status = render.status_as_dict(await client.properties())
        try:
            status.update(render.shares_as_dict(await client.shares()))
        except CliError:
            pass  # an agent from before share groups: no Shares1
        sources = await client.settings_sources()  # None from an agent before GetSettings
        if sources is not None:
            status["settings"] = sources
    if print_status:
        if options.json_output:
            _print_json(status)
        else:
            typer.echo(render.status_text(status, terminal_width()))
    return status


async def _change(
    options: Options, time_quantum_s=None, anti_thrash=None, memory_limit_bytes=None
) -> None:
    """Node-wide changes; then the node-wide settings."""
    async with connect(options.bus) as client:
        if time_quantum_s is not None:
            await client.set_time_quantum(time_quantum_s)
        if anti_thrash is not None:
            await client.set_anti_thrash(anti_thrash)
        if memory_limit_bytes is not None:
            await client.set_memory_limit(memory_limit_bytes)
        status = render.status_as_dict(await client.properties())
    keys = ("time_quantum_s", "anti_thrash", "anti_thrash_mode", "memory_limit_bytes")
    settings = {key: status[key] for key in keys}
    typer.echo(
        json.dumps(settings, sort_keys=True)
        if options.json_output
        else render.settings_text(status)
    )


def _gpu_id(text: str) -> str:
    try:
        return parse_gpu_id(text)
    except SettingsError as error:
        raise CliError(f"invalid value for --gpu: {error}", EXIT_USAGE) from None


async def _change_gpu(options: Options, gpu: str, values: dict, take_away=()) -> None:
    """One GPU's own settings: read GpuSettings, change its entry, write it back;
    then what that GPU runs by."""
    gpu_id = _gpu_id(gpu)
    async with connect(options.bus) as client:
        gpu_settings = await client.gpu_settings()
        entry = {**gpu_settings.get(gpu_id, {}), **values}
        for key in take_away:
            entry.pop(key, None)
        if entry != gpu_settings.get(gpu_id, {}):
            changed = {other: e for other, e in gpu_settings.items() if other != gpu_id}
            if entry:
                changed[gpu_id] = entry
            await client.set_gpu_settings(changed)
        status = render.status_as_dict(await client.properties())
    if options.json_output:
        typer.echo(json.dumps({"gpu": gpu_id, "settings": status["gpu_settings"].get(gpu_id, {})}))
    else:
        typer.echo(render.gpu_change_text(gpu_id, status, terminal_width()))


async def _memory_limit(options: Options, text: str, gpu: Optional[str]) -> None:
    try:
        num_bytes = parse_size(text)
    except SettingsError as error:
        raise CliError(f"invalid value: {error}", EXIT_USAGE) from None
    if gpu is None:
        await _change(options, memory_limit_bytes=num_bytes)
    else:
        await _change_gpu(options, gpu, {"memory_limit_bytes": num_bytes})


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"nvsharectl {version()}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def main_options(
    ctx: typer.Context,
    time_quantum: Optional[int] = typer.Option(
        None,
        "-T",
        "--time-quantum",
        metavar="SECONDS",
        show_default=False,
        help="Set the time quantum (as the original nvsharectl -T).",
    ),
    anti_thrash: Optional[Switch] = typer.Option(
        None,
        "-S",
        "--anti-thrash",
        show_default=False,
        help="Set anti-thrash on, off or auto (as the original nvsharectl -S).",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    bus: str = typer.Option(
        "system", "--bus", metavar="ADDRESS", help="D-Bus address of the agent's bus, or 'system'."
    ),
    _version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        expose_value=False,
        help="Print the version and exit.",
    ),
):
    """Without a command: apply -T/-S if given, else show the status."""
    ctx.obj = Options(json_output, bus)
    if ctx.invoked_subcommand is not None:
        if time_quantum is not None or anti_thrash is not None:
            typer.echo("nvsharectl: -T/-S cannot be combined with a command", err=True)
            raise typer.Exit(EXIT_USAGE)
        return
    if time_quantum is None and anti_thrash is None:
        _run(_status(ctx.obj))
    else:
        _run(
            _change(
                ctx.obj,
                time_quantum_s=time_quantum,
                anti_thrash=None if anti_thrash is None else anti_thrash.value,
            )
        )


@app.command()
def status(
    ctx: typer.Context, json_output: Optional[bool] = JSON_OPTION, bus: Optional[str] = BUS_OPTION
):
    """Settings, GPUs (holder, queue) and clients."""
    _run(_status(_options(ctx, json_output, bus)))


@app.command()
def clients(
    ctx: typer.Context, json_output: Optional[bool] = JSON_OPTION, bus: Optional[str] = BUS_OPTION
):
    """The processes connected to the agent, one row per GPU they use."""
    options = _options(ctx, json_output, bus)
    status_now = _run(_status(options, print_status=False))
    if options.json_output:
        _print_json(status_now["clients"])
    else:
        width = terminal_width()
        typer.echo(render.clients_text(status_now["clients"], status_now["gpus"], width))


@app.command()
def top(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="Print one frame (after ~1 s) and exit."),
    interval: float = typer.Option(
        1.0, "--interval", metavar="SECONDS", help="Seconds between frames (0.1..3600)."
    ),
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Who uses each GPU now and who waits and why, refreshed (Ctrl-C quits)."""
    options = _options(ctx, json_output, bus)
    if not 0.1 <= interval <= 3600:
        typer.echo(f"nvsharectl: --interval must be 0.1..3600 seconds, got {interval:g}", err=True)
        raise typer.Exit(EXIT_USAGE)
    # Ctrl-C is how top is left, also when started with SIGINT ignored (a background
    # job of a script hands that on, and Python then keeps it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(watch(options.bus, interval, once, options.json_output))
    except CliError as error:
        typer.echo(f"nvsharectl: {error}", err=True)
        raise typer.Exit(error.exit_code) from None
    except KeyboardInterrupt:
        pass  # Ctrl-C is how top is left: not a failure


@app.command()
def explain(
    ctx: typer.Context,
    pid: int = typer.Argument(..., metavar="PID", show_default=False),
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Why process PID waits for its GPU now, or that it runs, in a sentence."""
    options = _options(ctx, json_output, bus)
    status_now = _run(_status(options, print_status=False))
    try:
        said = explain_pid(status_now, pid)
    except LookupError:
        typer.echo(
            f"nvsharectl: no process {pid} is connected to the nvshare agent now "
            "(nvsharectl clients lists those that are)",
            err=True,
        )
        raise typer.Exit(EXIT_FAILED) from None
    if options.json_output:
        _print_json({"pid": pid, "gpus": said})
    else:
        typer.echo("\n".join(entry["sentence"] for entry in said))


# ignore_unknown_options: so `set-tq -5` reaches the range check as a number
# instead of being taken for an option.
@app.command("set-tq", context_settings={"ignore_unknown_options": True})
def set_tq(
    ctx: typer.Context,
    seconds: int = typer.Argument(..., metavar="SECONDS", help="1..86400"),
    gpu: Optional[str] = GPU_OPTION,
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Set the time quantum: how long a holder keeps a GPU while others wait.
    With --gpu, that GPU's own (nvsharectl reset --gpu ID time-quantum takes it away)."""
    options = _options(ctx, json_output, bus)
    if gpu is None:
        _run(_change(options, time_quantum_s=seconds))
    else:
        _run(_change_gpu(options, gpu, {"time_quantum_s": seconds}))


@app.command("anti-thrash")
def anti_thrash_command(
    ctx: typer.Context,
    switch: Switch = typer.Argument(..., metavar="on|off|auto"),
    gpu: Optional[str] = GPU_OPTION,
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Anti-thrash on (one process per GPU at a time), off (all at once), or auto
    (light work beside busy work while memory fits, turns when it does not).
    With --gpu, that GPU's own (nvsharectl reset --gpu ID anti-thrash takes it away)."""
    options = _options(ctx, json_output, bus)
    if gpu is None:
        _run(_change(options, anti_thrash=switch.value))
    else:
        _run(_change_gpu(options, gpu, {"anti_thrash": switch.value}))


@app.command("memory-limit")
def memory_limit_command(
    ctx: typer.Context,
    limit: str = typer.Argument(
        ...,
        metavar="SIZE|none",
        help="bytes, with K, M, G or T (powers of 1024): 40G; none (or 0): no limit",
    ),
    gpu: Optional[str] = GPU_OPTION,
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Anti-thrash auto: the most memory a GPU is taken to have, to keep room for work
    outside nvshare.  With --gpu, that GPU's own (nvsharectl reset --gpu ID memory-limit
    takes it away; 'none' with --gpu means no limit on that GPU, whatever the node's)."""
    _run(_memory_limit(_options(ctx, json_output, bus), limit, gpu))


@app.command("fair-page")
def fair_page_command(
    ctx: typer.Context,
    switch: OnOff = typer.Argument(..., metavar="on|off"),
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Holders side by side share each GPU by weight through its fair page (on, the
    default), or as the driver interleaves them (off: shims held now are let go)."""
    _run(_fair_page(_options(ctx, json_output, bus), switch.value))


async def _fair_page(options: Options, switch: str) -> None:
    async with connect(options.bus) as client:
        await client.set_fair_page(switch)
        now = render.status_as_dict(await client.properties())["fair_page"]
    typer.echo(json.dumps({"fair_page": now}) if options.json_output else f"fair page: {now}")


@app.command("reset")
def reset_command(
    ctx: typer.Context,
    setting: Optional[GpuSetting] = typer.Argument(
        None,
        metavar="[time-quantum|anti-thrash|memory-limit]",
        show_default=False,
        help="The setting to take away; all of the GPU's own when left out.",
    ),
    gpu: str = typer.Option(
        ...,
        "--gpu",
        metavar="ID",
        show_default=False,
        help="The GPU: its UUID (GPU-...) or its NVML index.",
    ),
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Take a GPU's own setting away (or all of them): it follows the node's again."""
    keys = [_GPU_SETTING_KEYS[setting]] if setting else list(_GPU_SETTING_KEYS.values())
    _run(_change_gpu(_options(ctx, json_output, bus), gpu, {}, take_away=keys))


@app.command("reset-setting")
def reset_setting_command(
    ctx: typer.Context,
    name: str = typer.Argument(
        ...,
        metavar="NAME",
        help="as the config file names it: time_quantum, anti_thrash, memory_limit, "
        "light_wait_ms, share_by, ... (with --share: weight, memory_cap)",
    ),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", metavar="ID", show_default=False, help="That GPU's own setting ([gpu:ID])."
    ),
    share: Optional[str] = typer.Option(
        None,
        "--share",
        metavar="GROUP",
        show_default=False,
        help="That share group's setting ([share:GROUP]): user:NAME, unit:NAME.service, pod:UID.",
    ),
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Take back a change made at run time: the config file's value (else the default)
    applies again, also after a restart.  status shows where each value comes from."""
    if gpu is not None and share is not None:
        typer.echo("nvsharectl: reset-setting takes --gpu or --share, not both", err=True)
        raise typer.Exit(EXIT_USAGE)
    _run(_reset_setting(_options(ctx, json_output, bus), name, gpu, share))


async def _reset_setting(options: Options, key: str, gpu, share) -> None:
    section = "scheduler"
    if gpu is not None:
        section = f"gpu:{_gpu_id(gpu)}"
    elif share is not None:
        section = f"share:{share.strip()}"
    async with connect(options.bus) as client:
        await client.reset_setting(section, key)
        rows = await client.settings_sources() or []
    wanted = key.strip().lower().replace("-", "_")
    # A group named user:NAME reads back as user:UID: the last row of that key is it.
    now = [row for row in rows if row["key"] == wanted and row["section"] == section]
    if options.json_output:
        _print_json(now[0] if now else {"section": section, "key": wanted})
    elif now:
        typer.echo(render.source_line(now[0]))
    else:  # a GPU's or a group's value that the file does not set: it has none of its own
        typer.echo(f"[{section}] {wanted}: none of its own")


share_app = typer.Typer(
    help="Share groups: fair GPU time and memory caps per user, unit or pod "
    "(docs/scheduling.md, Shares)."
)
app.add_typer(share_app, name="share")


class ShareBy(str, enum.Enum):
    user = "user"
    unit = "unit"
    process = "process"


GROUP_ARGUMENT = typer.Argument(
    ..., metavar="GROUP", help="user:NAME, user:UID, unit:NAME.service or pod:UID"
)


async def _shares(options: Options, change=None) -> None:
    async with connect(options.bus) as client:
        if change is not None:
            await change(client)
        shares = render.shares_as_dict(await client.shares())
    typer.echo(
        json.dumps(shares, indent=2, sort_keys=True)
        if options.json_output
        else render.shares_text(shares, terminal_width())
    )


@share_app.callback(invoke_without_command=True)
def share_show(
    ctx: typer.Context, json_output: Optional[bool] = JSON_OPTION, bus: Optional[str] = BUS_OPTION
):
    """What a share group is, each group's weight and memory cap, and on each GPU each
    group's use and share of the last minute."""
    if ctx.invoked_subcommand is None:
        _run(_shares(_options(ctx, json_output, bus)))


@share_app.command("set", context_settings={"ignore_unknown_options": True})
def share_set(
    ctx: typer.Context,
    group: str = GROUP_ARGUMENT,
    weight: Optional[int] = typer.Option(
        None, "--weight", metavar="N", help="1..1000: its GPU time against others' (default 1)"
    ),
    memory_cap: Optional[str] = typer.Option(
        None,
        "--memory-cap",
        metavar="SIZE|none",
        help="the most the group may allocate on each GPU: 4G; none: no cap",
    ),
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Set a group's weight and/or memory cap (root or group nvshare-admin)."""
    fields: dict = {}
    if weight is not None:
        fields["weight"] = weight
    if memory_cap is not None:
        try:
            fields["memory_cap_bytes"] = parse_size(memory_cap)
        except SettingsError as error:
            typer.echo(f"nvsharectl: invalid value: {error}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
    if not fields:
        typer.echo("nvsharectl: share set needs --weight or --memory-cap", err=True)
        raise typer.Exit(EXIT_USAGE)
    if weight is not None and not 1 <= weight <= 1000:
        typer.echo(
            f"nvsharectl: invalid value: a share's weight must be 1..1000, got {weight}", err=True
        )
        raise typer.Exit(EXIT_USAGE)

    async def change(client) -> None:
        await client.set_share(group, fields)

    _run(_shares(_options(ctx, json_output, bus), change))


@share_app.command("reset")
def share_reset(
    ctx: typer.Context,
    group: str = GROUP_ARGUMENT,
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """Take a group's settings away: weight 1, no cap."""

    async def change(client) -> None:
        await client.reset_share(group)

    _run(_shares(_options(ctx, json_output, bus), change))


@share_app.command("by")
def share_by(
    ctx: typer.Context,
    what: ShareBy = typer.Argument(..., metavar="user|unit|process"),
    json_output: Optional[bool] = JSON_OPTION,
    bus: Optional[str] = BUS_OPTION,
):
    """What a share group is: a user, a systemd unit or Kubernetes pod, or a process."""

    async def change(client) -> None:
        await client.set_share_by(what.value)

    _run(_shares(_options(ctx, json_output, bus), change))


def _preload(action: str) -> None:
    try:
        from . import preload
    except ImportError:
        typer.echo(
            "nvsharectl: preload management is not in this build (nvshare_cli.preload "
            "is missing); edit /etc/ld.so.preload by hand",
            err=True,
        )
        raise typer.Exit(EXIT_FAILED) from None
    try:
        result = getattr(preload, action)()
    except PermissionError as error:
        typer.echo(f"nvsharectl: permission denied: {error} (try sudo)", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except (OSError, ValueError, RuntimeError) as error:
        typer.echo(f"nvsharectl: {error}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if result is not None:
        typer.echo(result if isinstance(result, str) else json.dumps(result))


@preload_app.command("enable")
def preload_enable():
    """Add libnvshare.so to /etc/ld.so.preload (new processes only)."""
    _preload("enable")


@preload_app.command("disable")
def preload_disable():
    """Remove libnvshare.so from /etc/ld.so.preload (new processes only)."""
    _preload("disable")


@preload_app.command("status")
def preload_status():
    """Whether libnvshare.so is preloaded system-wide."""
    _preload("status")
