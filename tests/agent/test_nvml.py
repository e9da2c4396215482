"""The NVML adapter reads the inventory in a child process: what the agent gets
back when NVML works, fails, hangs or kills its reader.  pynvml is the stand-in
in fake_nvml/ (real NVML is checked on the GPU machine)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from nvshare_agent import nvml
from nvshare_agent.protocol import parse_uuid

FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"


@pytest.fixture
def fake_nvml(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE_NVML))  # the reader inherits the agent's sys.path

    def use(mode: str) -> None:
        monkeypatch.setenv("FAKE_NVML", mode)

    return use


@pytest.mark.parametrize("mode", ["two-gpus", "bytes"])
async def test_whole_gpus_are_listed_and_mig_instances_left_out(fake_nvml, mode):
    fake_nvml(mode)
    gpus, problem = await nvml.read_inventory()
    assert problem is None
    assert gpus == [
        nvml.GpuInfo(
            parse_uuid("GPU-0d84ee44-b797-1c71-8ccd-cefec22161de"),
            "NVIDIA H100 80GB HBM3",
            85520809984,
            index=0,
        ),
        # NVML's own numbers: the MIG instance the fake lists took index 1.
        nvml.GpuInfo(
            parse_uuid("GPU-11111111-2222-3333-4444-555555555555"),
            "NVIDIA L4",
            24152899584,
            index=2,
        ),
    ]


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("init-fails", "NVML unavailable: Driver Not Loaded"),
        ("missing", "pynvml is not installed"),
    ],
)
async def test_nvml_that_cannot_start_is_a_one_line_reason(fake_nvml, mode, reason):
    fake_nvml(mode)
    assert await nvml.read_inventory() == ([], reason)


async def test_a_reader_that_dies_is_reported_not_raised(fake_nvml):
    fake_nvml("crashes")
    gpus, problem = await nvml.read_inventory()
    assert gpus == []
    assert problem.startswith("NVML reader failed (exit status 134)")


async def test_a_hung_nvml_is_abandoned_after_the_timeout(fake_nvml):
    fake_nvml("hangs")
    started = time.monotonic()
    gpus, problem = await nvml.read_inventory(timeout_s=1.5)
    assert (gpus, problem) == ([], "NVML did not answer within 1.5 s")
    assert time.monotonic() - started < 10


def test_the_agent_logs_its_inventory(fake_nvml, start_agent):
    fake_nvml("two-gpus")
    agent = start_agent(env={"PYTHONPATH": f"{FAKE_NVML}:{':'.join(p for p in sys.path if p)}"})
    agent.wait_for_log(
        r"gpu uuid=GPU-0d84ee44-b797-1c71-8ccd-cefec22161de name=NVIDIA_H100_80GB_HBM3 "
        r"memory_total_bytes=85520809984"
    )
    agent.wait_for_log(r"gpu uuid=GPU-11111111-2222-3333-4444-555555555555 name=NVIDIA_L4")
    assert "MIG" not in agent.log()


async def test_an_agent_stopping_while_nvml_hangs_leaves_no_reader_behind(fake_nvml):
    fake_nvml("hangs")
    reading = asyncio.create_task(nvml.read_inventory())
    await asyncio.sleep(1.0)
    assert nvml_readers(), "the reader was not started"
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert nvml_readers() == []


def nvml_readers() -> list[int]:
    """This process's live children running `-m nvshare_agent.nvml_reader` (zombies are not
    running).  Only its own: tests run side by side (pytest -n) start readers too."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if b"nvshare_agent.nvml_reader" in command and state != "Z" and int(parent) == os.getpid():
            found.append(int(entry.name))
    return found
