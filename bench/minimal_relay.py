#!/usr/bin/env python3
"""A floor for agent_bench.py: the least an asyncio server can do per handoff.

One GPU, one FIFO of waiters, no scheduler core, no logging, no validation:
it answers HELLO with SETTINGS, grants in order, and hands over on RELEASED or
disconnect.  `agent_bench.py --baseline` runs the same clients against it, so
the agent's numbers can be told apart from what this machine, its kernel and
the Python clients allow.  Not part of nvshare.
"""

import asyncio
import sys
from collections import deque

from nvshare_agent import protocol
from nvshare_agent.protocol import MessageType

BUFFER = memoryview(bytearray(65536))
GPU = bytes(16)
_TYPE_AT = protocol.ffi.offsetof("struct nvshare_header", "type")
_SIZE_AT = protocol.ffi.offsetof("struct nvshare_header", "payload_bytes")


class Lock:
    def __init__(self):
        self.holder = None
        self.waiters = deque()
        self.lease = 0

    def grant(self, transport):
        self.lease += 1
        self.holder = transport
        transport.write(protocol.encode_lock(MessageType.LOCK_GRANT, GPU, self.lease, 1))

    def free(self):
        self.holder = None
        if self.waiters:
            self.grant(self.waiters.popleft())


LOCK = Lock()


class Relay(asyncio.BufferedProtocol):
    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        return BUFFER

    def buffer_updated(self, nbytes):
        data, offset = bytes(BUFFER[:nbytes]), 0
        while offset + protocol.HEADER_BYTES <= len(data):
            msg_type = int.from_bytes(
                data[offset + _TYPE_AT : offset + _TYPE_AT + 2], sys.byteorder
            )
            size = int.from_bytes(data[offset + _SIZE_AT : offset + _SIZE_AT + 4], sys.byteorder)
            if msg_type == MessageType.HELLO:
                self.transport.write(
                    protocol.encode_settings(
                        anti_thrash=True,
                        time_quantum_ms=1000,
                        idle_release_ms=1000,
                        drop_grace_ms=1000,
                    )
                )
            elif msg_type == MessageType.LOCK_REQUEST:
                if LOCK.holder is None:
                    LOCK.grant(self.transport)
                else:
                    LOCK.waiters.append(self.transport)
            elif msg_type == MessageType.RELEASED:
                LOCK.free()
            offset += protocol.HEADER_BYTES + size

    def connection_lost(self, exc):
        if LOCK.holder is self.transport:
            LOCK.free()
        elif self.transport in LOCK.waiters:
            LOCK.waiters.remove(self.transport)


async def main(path):
    await asyncio.get_running_loop().create_unix_server(Relay, path=path)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[sys.argv.index("--socket") + 1]))
