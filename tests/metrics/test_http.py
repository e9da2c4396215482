"""nvshare-metrics as an inetd-style server of one request: what it answers to good
and bad requests, slow and silent clients, and wrong ways of starting it.  No
agent here (the bus address leads nowhere): a refused request never reads the
bus, and a scrape then says nvshare_agent_up 0."""

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from metrics_harness import (
    NO_BUS,
    TIMEOUT_S,
    InetdListener,
    exchange,
    exporter_command,
    get,
    read_until_closed,
    samples,
)

from nvshare_cli import render
from nvshare_metrics.exposition import FAMILY_NAMES, exposition
from nvshare_metrics.inetd import MAX_HEAD_BYTES

REPO = Path(__file__).resolve().parents[2]
EXPORTER = exporter_command(NO_BUS)
# A client gets its whole timeout; the process's start (Python, imports) comes before
# it, which a loaded 2-core machine stretches to a few seconds.
FAST_TIMEOUT = exporter_command(NO_BUS, "--timeout", "1")
START_SLACK_S = 10.0


def test_a_scrape_without_an_agent_answers_agent_up_0_and_logs_why():
    answer = exchange(EXPORTER, get())
    assert answer.status == 200 and answer.returncode == 0
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert answer.headers["connection"] == "close"
    assert samples(answer.body.decode()) == {("nvshare_agent_up", frozenset()): 0.0}
    (line,) = answer.log_lines
    assert "WARNING agent did not answer, nvshare_agent_up 0: cannot connect" in line


def test_head_gets_the_headers_and_no_body():
    answer = exchange(EXPORTER, get(method="HEAD"))
    assert answer.status == 200 and answer.body == b""
    assert int(answer.headers["content-length"]) > 0


def test_a_query_string_is_ignored_and_bare_newlines_are_accepted():
    answer = exchange(EXPORTER, b"GET /metrics?name[]=x HTTP/1.0\nAccept: */*\n\n")
    assert answer.status == 200 and b"nvshare_agent_up 0.0" in answer.body


def test_an_openmetrics_scraper_gets_openmetrics():
    answer = exchange(EXPORTER, get(accept="application/openmetrics-text;version=1.0.0,*/*;q=0.1"))
    assert answer.headers["content-type"].startswith("application/openmetrics-text;")
    assert answer.body.endswith(b"# EOF\n")


@pytest.mark.parametrize(
    "request_bytes, status, logged",
    [
        (get("/"), 404, "method='GET' target='/'"),
        (get("/metrics/"), 404, "target='/metrics/'"),
        (get("/../../etc/passwd"), 404, "target='/../../etc/passwd'"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405, "method='POST'"),
        (get(method="DELETE"), 405, "method='DELETE'"),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505, "only HTTP/1.0 and HTTP/1.1"),
        (b"GET /metrics\r\n\r\n", 400, "request line is not"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, "request line is not"),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400, "header line"),
    ],
    ids=["root", "slash", "traversal", "post", "delete", "http2", "http09", "tls", "header"],
)
def test_a_bad_request_gets_its_status_and_one_log_line(request_bytes, status, logged):
    answer = exchange(EXPORTER, request_bytes)
    assert answer.status == status and answer.returncode == 0, answer
    assert answer.headers["connection"] == "close"
    if status == 405:
        assert answer.headers["allow"] == "GET, HEAD"
    (line,) = answer.log_lines
    assert f"INFO request refused status={status}" in line and logged in line, line
    assert b"nvshare_" not in answer.body  # nothing of the agent's state


def test_a_request_head_past_the_limit_is_refused_without_waiting_for_the_rest():
    big = b"GET /metrics HTTP/1.1\r\nX-Padding: " + b"a" * (MAX_HEAD_BYTES + 10)
    answer = exchange(FAST_TIMEOUT, big)  # never ends the head
    assert answer.status == 431, answer
    (line,) = answer.log_lines
    assert "status=431" in line and f"longer than {MAX_HEAD_BYTES} bytes" in line


def test_a_client_that_trickles_its_request_is_cut_off_at_the_timeout():
    # slowloris: a byte every 0.1 s would take ~5 s for this request.
    answer = exchange(FAST_TIMEOUT, get() + b"X" * 20, trickle_s=0.1)
    assert answer.status == 408, answer
    assert answer.seconds < 1 + START_SLACK_S
    (line,) = answer.log_lines
    assert "status=408" in line and "within 1 s" in line


def test_a_silent_client_is_answered_408_and_the_connection_closed():
    answer = exchange(FAST_TIMEOUT, b"")
    assert answer.status == 408 and answer.returncode == 0
    assert 1 <= answer.seconds < 1 + START_SLACK_S


def test_a_client_that_leaves_without_a_request_costs_one_line():
    answer = exchange(EXPORTER, b"GET /met", shut_write=True)
    assert answer.raw == b"" and answer.returncode == 0
    (line,) = answer.log_lines
    assert "request refused status=- " in line and "closed before a complete request" in line


def test_standard_input_that_is_no_connection_is_bad_usage():
    result = subprocess.run(
        EXPORTER, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("nvshare-metrics: standard input is not a connection")


def test_a_listening_socket_on_standard_input_is_bad_usage():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    with listener:
        result = subprocess.run(
            EXPORTER, stdin=listener, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    assert result.returncode == 2
    assert "a listening socket, not a connection: the socket unit needs Accept=yes" in (
        result.stderr
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--timeout", "0"], "--timeout must be more than 0"),
        (["--bus", "sytem"], "--bus 'sytem' is not a D-Bus address"),
        (["--port", "1"], "unrecognized arguments: --port 1"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "nvshare_metrics", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert message in line and line.startswith("nvshare-metrics: error:")


def test_a_slow_client_does_not_hold_up_a_scrape_beside_it(tmp_path):
    # As systemd runs it (Accept=yes): a process per connection.
    listener = InetdListener(FAST_TIMEOUT, tmp_path / "activate.log").start()
    try:
        slow = listener.connect()
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")  # and nothing more
        with listener.connect() as scraper:
            began = time.monotonic()
            scraper.sendall(get())
            answer = read_until_closed(scraper)
            took = time.monotonic() - began
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"nvshare_agent_up 0.0" in answer
        assert took < START_SLACK_S
        slow.settimeout(1 + START_SLACK_S)
        assert read_until_closed(slow).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        slow.close()
    finally:
        listener.stop()
    log = listener.log()
    assert len(re.findall(r"status=408 .*peer=127\.0\.0\.1:\d+", log)) == 1, log


def test_every_family_written_is_documented_and_none_other():
    status = render.status_as_dict(
        {
            "TimeQuantum": 30,
            "AntiThrash": True,
            "AntiThrashMode": "auto",
            "Gpus": [["GPU-a", "H100", 80 << 30, [7], []]],
            "Clients": [[7, 0, 0, "python3", [["GPU-a", "holding", 1 << 30, 2.0]]]],
            "GpuDetails": {
                "GPU-a": {
                    "anti_thrash": "auto",
                    "mode": "shared",
                    "memory_capacity_bytes": 80 << 30,
                    "memory_demand_bytes": 1 << 30,
                }
            },
            "ClientDetails": {
                7: {
                    "user": "root",
                    "unit": "a.service",
                    "container": "",
                    "per_gpu": {
                        "GPU-a": {
                            "gpu_seconds": 2.5,
                            "recent_use": 1.0,
                            "wait_cause": "",
                            "waited_s": {"turn": 0.5},
                        }
                    },
                }
            },
            "Statistics": {},
        }
    )
    status.update(
        render.shares_as_dict(
            {
                "ShareBy": "user",
                "Shares": {},
                "Groups": [
                    {
                        "gpu": "GPU-a",
                        "group": "user:0",
                        "weight": 1,
                        "memory_cap_bytes": 0,
                        "use": 1.0,
                        "share": 0.5,
                        "clients": 1,
                        "gpu_seconds": 2.5,
                        "waited_s": {"turn": 0.5},
                    }
                ],
            }
        )
    )
    body, _ = exposition(status)
    names = {name for name, _ in samples(body.decode())}
    families = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in names}
    assert families == set(FAMILY_NAMES)
    documented = (REPO / "docs/metrics.md").read_text()
    missing = sorted(name for name in names if f"`{name}" not in documented)
    assert missing == [], f"not in docs/metrics.md: {missing}"
