"""What the agent learns from a real shim, read through the engine (the same
object the D-Bus API publishes): the process, its GPU, its allocations,
and its lock state.  The agent runs in the test's event loop on a real socket."""

import asyncio
import os

from shim_harness import STANDIN_BUILD, STANDIN_GPU

from nvshare_agent.engine import Engine
from nvshare_agent.settings import AntiThrash, Settings
from nvshare_agent.settings_files import SettingsStore
from nvshare_agent.shim_connections import ShimConnections

MIB = 1 << 20


async def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := predicate()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


async def test_agent_sees_the_clients_allocations_and_lock_state(world):
    loop = asyncio.get_running_loop()
    settings = Settings(
        time_quantum_s=1, anti_thrash=AntiThrash.ON, idle_release_ms=100, drop_grace_ms=300
    )
    agent = Engine(settings, SettingsStore(world.tmp / "state"), loop=loop)
    connections = ShimConnections(agent)
    server = await loop.create_unix_server(
        connections.protocol_factory, path=str(world.socket_path)
    )
    try:
        # 1 MiB converted to managed memory, plus 2 MiB of VMM passed through, then long idle gaps.
        client = await asyncio.create_subprocess_exec(
            str(STANDIN_BUILD / "client_linked"),
            "--ints",
            str(MIB // 4),
            "--vmm",
            "--loops",
            "3",
            "--sleep-ms",
            "1500",
            env=world.env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

        def mine():
            return [c for c in agent.snapshot().clients if c.pid == client.pid]

        seen = await wait_for(
            lambda: [c for c in mine() if c.gpus and c.gpus[0].allocated_bytes >= MIB],
            "a memory report of at least 1 MiB",
        )
        process = seen[0]
        assert process.command == "client_linked" and process.uid == os.getuid()
        assert process.gpus[0].uuid == STANDIN_GPU
        assert any(g.uuid == STANDIN_GPU for g in agent.snapshot().gpus)
        # Between bursts it releases: the agent shows it idle, holding nothing.
        await wait_for(lambda: [c for c in mine() if c.gpus[0].state == "idle"], "the idle client")
        await wait_for(lambda: not any(g.holder_pids for g in agent.snapshot().gpus), "no holder")
        stdout, stderr = await asyncio.wait_for(client.communicate(), 60)
        assert client.returncode == 0, stderr.decode()
        assert b"result=ok" in stdout
        await wait_for(lambda: not mine(), "the client's disconnect")
    finally:
        server.close()
        agent.cancel_timers()
        connections.close_all()
        await server.wait_closed()
