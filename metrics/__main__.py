"""nvshare-metrics: the nvshare agent's state for Prometheus, one scrape per process.

nvshare-metrics.socket listens on 127.0.0.1:9402 and starts an instance of
nvshare-metrics@.service for each connection, the connection as standard input
and output (Accept=yes, inetd style).  This program reads one HTTP request
from it, answers GET /metrics with the agent's state, read over D-Bus once,
and anything else with an error status, in one log line; then it exits.

Exit codes: 0 a request was handled, refused ones included (a client's bad
request is not a failed unit); 2 bad usage, such as standard input that is no
connection.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

from nvshare_agent import eventlog
from nvshare_agent.bus_address import EXAMPLE, bus_address_problem
from nvshare_agent.one_line_parser import OneLineParser
from nvshare_agent.text import excerpt
from nvshare_agent.version import VersionAction
from nvshare_cli import render
from nvshare_cli.client import CliError, connect

from .exposition import exposition
from .inetd import REASONS, BadRequest, Request, read_request, respond

PROG = "nvshare-metrics"
PATH = "/metrics"
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 300.0
DEFAULT_URL = "http://127.0.0.1:9402/metrics"

log = eventlog.events


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineParser(
        prog=PROG,
        description="Answer one HTTP request on standard input, a connection that systemd "
        f"(nvshare-metrics.socket) or inetd accepted: GET {PATH} gets the nvshare agent's "
        "state in the Prometheus text format.",
    )
    parser.add_argument(
        "--bus",
        default="system",
        metavar="ADDRESS",
        help="the agent's D-Bus bus: system (default) or a D-Bus address",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="how long a client may take to send its request, and again to take the answer "
        f"(default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--debug", action="store_true", help="also log every scrape that was answered"
    )
    parser.add_argument(
        "--version",
        action=VersionAction,
        help="print the version and exit",
    )
    args = parser.parse_args(argv)
    if not 0 < args.timeout <= MAX_TIMEOUT_S:
        parser.error(f"--timeout must be more than 0 and at most {MAX_TIMEOUT_S:g}")
    if args.bus != "system":
        problem = bus_address_problem(args.bus)
        if problem:
            parser.error(
                f"--bus {excerpt(args.bus)} is not a D-Bus address ({problem}); "
                f"use 'system' or an address such as {EXAMPLE}"
            )
    return args


async def _read_agent(address: str) -> dict:
    async with connect(address) as client:
        status = render.status_as_dict(await client.properties())
        try:
            status.update(render.shares_as_dict(await client.shares()))
        except CliError:
            pass  # an agent from before share groups
        return status


def read_agent(address: str) -> tuple[dict | None, str]:
    """The status dict that `nvsharectl status --json` prints, read over D-Bus
    once; (None, why) when the agent did not answer.  Like nvsharectl, the call
    starts the agent through D-Bus activation where it is not running yet."""
    try:
        return asyncio.run(_read_agent(address)), ""
    except CliError as error:
        return None, str(error)


def _peer(connection: socket.socket) -> str:
    try:
        name = connection.getpeername()
    except OSError:
        return "unknown"
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    return "local"  # an AF_UNIX socket (a test's socket pair)


def _refusal_line(status: int, reason: str, request: Request | None, peer: str) -> str:
    what = f" method={excerpt(request.method)} target={excerpt(request.target)}" if request else ""
    return f"request refused status={status or '-'}{what} peer={peer} reason={reason}"


def serve(connection: socket.socket, args: argparse.Namespace) -> None:
    peer = _peer(connection)
    try:
        request = read_request(connection, args.timeout)
        if request.method not in ("GET", "HEAD"):
            raise BadRequest(405, f"only GET and HEAD {PATH}", request)
        if request.path != PATH:
            raise BadRequest(404, f"only {PATH} is served", request)
    except BadRequest as refused:
        log.info("%s", _refusal_line(refused.status, refused.reason, refused.request, peer))
        if refused.status:
            text = f"{refused.status} {REASONS[refused.status]}: {refused.reason}\n"
            allow = (("Allow", "GET, HEAD"),) if refused.status == 405 else ()
            _answer(connection, refused.status, text.encode(), args, extra_headers=allow)
        return
    status, problem = read_agent(args.bus)
    if problem:
        log.warning("agent did not answer, nvshare_agent_up 0: %s", problem)
    body, content_type = exposition(status, request.headers.get("accept", ""))
    if _answer(
        connection,
        200,
        body,
        args,
        content_type=content_type,
        send_body=request.method == "GET",
    ):
        log.debug("scrape answered bytes=%d agent_up=%d peer=%s", len(body), bool(status), peer)


def _answer(connection, status: int, body: bytes, args, **options) -> bool:
    try:
        respond(connection, status, body, timeout_s=args.timeout, **options)
        return True
    except OSError as error:  # TimeoutError included: a client that does not read
        log.info("answer not taken status=%d reason=%s", status, error.strerror or error)
        return False


def main(argv=None) -> int:
    args = parse_args(argv)
    eventlog.setup(args.debug)
    try:
        # The connection is standard input (and output: the same socket).
        connection = socket.socket(fileno=os.dup(0))
    except OSError as error:
        print(
            f"{PROG}: standard input is not a connection ({error.strerror or error}): "
            f"{PROG} answers one request that systemd's nvshare-metrics.socket hands over; "
            f"scrape {DEFAULT_URL} instead",
            file=sys.stderr,
        )
        return 2
    if connection.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        connection.close()
        print(
            f"{PROG}: standard input is a listening socket, not a connection: "
            "the socket unit needs Accept=yes (nvshare-metrics.socket has it)",
            file=sys.stderr,
        )
        return 2
    try:
        serve(connection, args)
    finally:
        connection.close()
        eventlog.events.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
