"""nvsharectl when its call is cut short: the agent stops before it answers,
the bus goes away, the user presses Ctrl-C.  Each is one line that says which.

A stand-in agent in the test owns the bus name and, when nvsharectl's call
arrives, does the thing under test: no timing guesses."""

import asyncio
import os
import signal
import sys

from dbus_harness import TIMEOUT_S
from dbus_next import MessageType

from nvshare_agent import dbus_names as names
from nvshare_agent.dbus_connection import connect_bus


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def nvsharectl_meets(bus, on_call, *args: str):
    """Runs `nvsharectl status`; on_call(stand-in's connection, nvsharectl's pid)
    runs when its call reaches the stand-in agent.  Returns (exit status, stdout, stderr)."""
    standin = await connect_bus(bus.address, TIMEOUT_S)
    cli = None

    def on_message(message):
        if message.message_type == MessageType.METHOD_CALL and message.path == names.OBJECT_PATH:
            on_call(standin, cli.pid)
            return True
        return None

    standin.add_message_handler(on_message)
    await standin.request_name(names.BUS_NAME)
    try:
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nvshare_cli",
            "--bus",
            bus.address,
            *(args or ["status"]),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            # Ctrl-C reaches a program started from a terminal, where SIGINT is not
            # ignored; a background job or a CI runner may start the tests with it
            # ignored, and the child would inherit that.
            preexec_fn=_default_sigint,
        )
        out, err = await asyncio.wait_for(cli.communicate(), TIMEOUT_S)
        return cli.returncode, out.decode(), err.decode()
    finally:
        if standin.connected:
            standin.disconnect()


async def test_agent_that_stops_before_it_answers_is_not_called_slow(bus):
    code, out, err = await nvsharectl_meets(bus, lambda standin, _: standin.disconnect())
    assert (code, out) == (1, "")
    assert err == (
        "nvsharectl: the nvshare agent stopped before it answered: "
        "see journalctl -u nvshare.service\n"
    )


async def test_bus_that_goes_away_during_the_call_is_one_line(bus):
    code, out, err = await nvsharectl_meets(bus, lambda *_: bus.process.kill())
    assert (code, out) == (1, "")
    assert err.startswith(f"nvsharectl: lost the connection to the bus at {bus.address}"), err
    assert err.count("\n") == 1, err


async def test_ctrl_c_during_the_call_is_interrupted_exit_130(bus):
    code, out, err = await nvsharectl_meets(bus, lambda _, pid: os.kill(pid, signal.SIGINT))
    assert (code, out, err) == (130, "", "nvsharectl: interrupted\n")
