"""nvsharectl status's text: one account of a GPU's memory, and a config problem said
first and whole (issue 36).  The values are what the agent publishes (render's
status dict); tests/dbus/ read them from the real agent."""

from __future__ import annotations

import re

from nvshare_cli import render

UUID = "GPU-5374616e-6469-6e00-0000-000000000000"
GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


def status(**gpu) -> dict:
    """A node without NVML (a container, CI): one stand-in GPU learned from its
    client, which allocated 4 KiB; auto counts a 512 MiB context estimate beside it."""
    return {
        "config_problem": "",
        "time_quantum_s": 30,
        "anti_thrash": True,
        "anti_thrash_mode": "auto",
        "memory_limit_bytes": 0,
        "gpus": [
            {
                "uuid": UUID,
                "name": "",
                "memory_total_bytes": 0,
                "holder_pids": [7],
                "queue_pids": [],
                "anti_thrash": "auto",
                "mode": "shared",
                "memory_capacity_bytes": 16 * GiB,
                "memory_demand_bytes": 512 * MiB + 4 * KiB,
                "time_quantum_s": 30,
                "memory_limit_bytes": 0,
                "index": -1,
                "own_settings": [],
                **gpu,
            }
        ],
        "clients": [
            {
                "pid": 7,
                "uid": 0,
                "gid": 0,
                "command": "client_linked",
                "user": "root",
                "unit": "",
                "container": "",
                "gpus": [
                    {
                        "uuid": UUID,
                        "state": "holding",
                        "allocated_bytes": 4 * KiB,
                        "holding_seconds": 1.0,
                    }
                ],
            }
        ],
    }


def line(text: str, start: str) -> str:
    (found,) = [row for row in text.splitlines() if row.lstrip().startswith(start)]
    return found


def test_without_nvml_the_gpu_mode_and_client_lines_give_one_account_of_memory():
    text = render.status_text(status())
    # The size auto counts with, where it comes from, on the GPU line: not "memory unknown"
    # beside a mode line that knows 16 GiB.
    assert line(text, "GPU 0").endswith(f"{UUID}  16.0 GiB (clients' figure)")
    assert line(text, "mode:").endswith("shared (auto: memory fits, 512.0 MiB of 16.0 GiB)")
    # The 512 MiB told apart: the clients' allocations (the MEMORY column) and the rest.
    assert line(text, "memory:").endswith(
        "512.0 MiB in use: 4.0 KiB allocated + 512.0 MiB contexts, others"
    )
    assert re.search(r"\b7  root  0    holding  4\.0 KiB", text), text
    assert all(len(row) <= render.WIDTH for row in text.splitlines()), text


def test_a_gpu_size_known_only_as_a_memory_limit_is_not_taken_for_the_gpus():
    text = render.status_text(status(memory_capacity_bytes=8 * GiB, memory_limit_bytes=8 * GiB))
    assert line(text, "GPU 0").endswith(f"{UUID}  size unknown")


def test_nvmls_figure_is_the_gpus_size():
    text = render.status_text(status(memory_total_bytes=80 * GiB, memory_capacity_bytes=80 * GiB))
    assert line(text, "GPU 0").endswith(f"{UUID}  80.0 GiB")


def test_no_memory_line_while_nothing_is_in_use():
    assert "memory:" not in render.status_text(status(memory_demand_bytes=0))


def test_a_config_problem_comes_first_whole_and_printable():
    problem = "config /etc/nvshare/nvshare.conf line 3: unknown key 'sp\x1beed' " + "x " * 60
    text = render.status_text({**status(), "config_problem": problem})
    head = text.split("\n\n")[0].splitlines()
    assert head[0].startswith("CONFIG ERROR: config /etc/nvshare/nvshare.conf line 3:")
    assert len(head) > 1 and all(len(row) <= render.WIDTH for row in head)
    assert (
        " ".join(row.strip() for row in head)
        == "CONFIG ERROR: " + problem.replace("\x1b", "\ufffd").strip()
    )
