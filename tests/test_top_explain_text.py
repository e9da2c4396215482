"""nvsharectl top's frames and explain's sentences, from the agent's figures
as status_as_dict gives them (the end-to-end runs are tests/dbus/test_nvsharectl_top.py)."""

import pytest

from nvshare_cli.explain import explain
from nvshare_cli.top import Reading, frame_data, frame_lines, seconds_text

GiB = 1 << 30


def _status(waiter_cause="memory", limit=0, holder_connections=1):
    holder_entry = {
        "uuid": "GPU-a",
        "state": "holding",
        "allocated_bytes": 70 * GiB,
        "holding_seconds": 12.0,
        "gpu_seconds": 100.0,
        "recent_use": 1.0,
        "wait_cause": "",
        "waited_s": {},
    }
    holders = [
        {
            "pid": 10,
            "uid": 1000,
            "user": "alice",
            "unit": "jupyter-alice.service",
            "container": "",
            "command": "train",
            "gpus": [dict(holder_entry, state="idle" if n else "holding", allocated_bytes=GiB)],
        }
        for n in range(holder_connections)
    ]
    holders[0]["gpus"][0]["allocated_bytes"] = 70 * GiB
    return {
        "time_quantum_s": 30,
        "gpus": [
            {
                "uuid": "GPU-a",
                "name": "H100",
                "memory_total_bytes": 80 * GiB,
                "memory_capacity_bytes": 80 * GiB,
                "memory_limit_bytes": limit,
                "time_quantum_s": 30,
                "holder_pids": [10],
                "queue_pids": [11],
                "index": 0,
            }
        ],
        "clients": [
            *holders,
            {
                "pid": 11,
                "uid": 1001,
                "user": "bob",
                "unit": "",
                "container": "pod:1234/ctr",
                "command": "infer",
                "gpus": [
                    {
                        "uuid": "GPU-a",
                        "state": "waiting",
                        "allocated_bytes": 20 * GiB,
                        "holding_seconds": 0.0,
                        "gpu_seconds": 5.0,
                        "recent_use": 0.0,
                        "wait_cause": waiter_cause,
                        "waited_s": {waiter_cause: 11.0, "turn": 3.0},
                    }
                ],
            },
        ],
    }


def _frame(**options):
    before, after = _status(**options), _status(**options)
    after["clients"][0]["gpus"][0]["gpu_seconds"] = 100.5  # half of the second
    return frame_data(Reading(before, 0.0), Reading(after, 1.0))


def test_gpu_time_percent_is_the_rate_over_the_interval_and_sorts_the_rows():
    data = _frame()
    first, second = data["clients"]
    assert (first["pid"], first["gpu_percent"]) == (10, 50.0)
    assert (second["pid"], second["gpu_percent"], second["waited_total_s"]) == (11, 0.0, 14.0)
    assert data["gpus"][0]["gpu_percent"] == 50.0 and data["gpus"][0]["waiting"] == 1


def test_connections_of_one_process_are_one_row_in_its_busiest_state():
    data = _frame(holder_connections=3)
    (row,) = [row for row in data["clients"] if row["pid"] == 10]
    assert row["state"] == "holding" and row["memory_bytes"] == 72 * GiB
    assert row["gpu_percent"] == 50.0  # the process's figure, taken once


@pytest.mark.parametrize("width", [80, 100, 119, 120, 200])
def test_every_line_fits_and_the_unit_or_pod_gets_a_column_from_120(width):
    lines = frame_lines(_frame(), width, "12:00:00")
    assert all(len(line) <= width for line in lines)
    assert ("UNIT/POD" in lines[3]) == (width >= 120)
    if width >= 120:
        assert "pod:1234/ctr  " in lines[5]  # a column of its own, before the command


def test_seconds_read_short():
    assert [seconds_text(s) for s in (0.4, 59.9, 245, 7380, 273600)] == [
        "0.4s",
        "59.9s",
        "4m05s",
        "2h03m",
        "3d04h",
    ]


def test_explain_memory_names_what_it_needs_beside_what_is_held():
    (said,) = explain(_status("memory"), 11)
    assert said["wait_cause"] == "memory"
    assert said["sentence"] == (
        "PID 11 (infer) waits for GPU 0 because its memory does not fit beside the holder's: "
        "it needs 20.0 GiB beside the 70.0 GiB that PID 10 (train) holds of the 80.0 GiB the "
        "agent counts the GPU as having; it gets the GPU when PID 10 releases it (asked to "
        "once it has waited the time quantum, 30 s) or frees memory; it has waited 14.0s in "
        "all (memory 11.0s, turn 3.0s)."
    )
    (limited,) = explain(_status("memory", limit=40 * GiB), 11)
    assert (
        "(the memory limit, 40.0 GiB, counts the GPU smaller than it may be)"
        in (limited["sentence"])
    )


@pytest.mark.parametrize(
    "cause, words",
    [
        ("turn", "for its turn: it and PID 10 (train) both keep the GPU busy"),
        ("latency work", "while PID 10 (train) runs a short burst of work"),
        ("share", "because other share groups are owed more of its time"),
        ("", "behind PID 10 (train)"),
    ],
)
def test_explain_says_each_cause(cause, words):
    (said,) = explain(_status(cause), 11)
    assert said["sentence"].startswith("PID 11 (infer) waits for GPU 0 ")
    assert words in said["sentence"]


def test_explain_of_the_holder_and_of_no_such_process():
    (said,) = explain(_status(), 10)
    assert said["sentence"].startswith("PID 10 (train) runs on GPU 0: it holds the GPU (12.0s")
    assert said["sentence"].endswith(
        "1 process waits behind it, so its turn ends after the time quantum (30 s)."
    )
    with pytest.raises(LookupError):
        explain(_status(), 12)
