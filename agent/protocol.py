"""The wire format: the messages, and how they are encoded and decoded.

The layout (constants, enums, each message type's struct) is read from the one
C header that the shim also compiles, in wire_layout.py; this module re-exports
it, so that everything in Python that speaks frames (the agent's socket adapter,
the tests, the benches) imports one module.

Frames are a fixed header followed by exactly header.payload_bytes of payload,
whose size is fixed by header.type.  Integers are in native byte order: both
peers are on one host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .wire_layout import (
    BEGIN_MARKER,
    COMMAND_BYTES,
    DEFAULT_DROP_GRACE_MS,
    DEFAULT_SOCKET_PATH,
    END_MARKER,
    ERROR_TEXT_BYTES,
    HEADER_BYTES,
    HEADER_STRUCT,
    LOCK_STRUCT,
    LOCK_TYPES,
    MAGIC,
    MAX_GPUS,
    MAX_PAYLOAD_BYTES,
    PAYLOAD_BYTES,
    PAYLOAD_STRUCT,
    UUID_BYTES,
    VERSION,
    AntiThrashWire,
    DropFlags,
    ErrorCode,
    Features,
    GrantFlags,
    MessageType,
    derived_struct,
    ffi,
)

# Re-exported: the layout is wire_layout's, imported from here.
__all__ = [
    "BEGIN_MARKER",
    "COMMAND_BYTES",
    "DEFAULT_DROP_GRACE_MS",
    "DEFAULT_SOCKET_PATH",
    "END_MARKER",
    "ERROR_TEXT_BYTES",
    "HEADER_BYTES",
    "HEADER_STRUCT",
    "LOCK_STRUCT",
    "MAGIC",
    "MAX_GPUS",
    "MAX_PAYLOAD_BYTES",
    "PAYLOAD_BYTES",
    "PAYLOAD_STRUCT",
    "UUID_BYTES",
    "VERSION",
    "AntiThrashWire",
    "DropFlags",
    "ErrorCode",
    "Features",
    "GrantFlags",
    "MessageType",
    "derived_struct",
    "ffi",
]

_LOCK_TYPE_SET = frozenset(int(t) for t in LOCK_TYPES)
_LOCK_PAYLOAD_BYTES = LOCK_STRUCT.size
_REPORT_GPU_OFFSET = ffi.offsetof("struct nvshare_memory_report", "gpu")


class ProtocolError(Exception):
    """A frame the peer must not send; str() is the one-line reason for the log."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = ErrorCode(code)
        # The good frames that came before the bad one in the same read: the
        # caller should act on them (a RELEASED must not be lost) before closing.
        self.messages: list[Message] = []


# ---------------------------------------------------------------- GPU UUIDs


def format_uuid(raw: bytes) -> str:
    """16 raw bytes -> "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML prints it."""
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def parse_uuid(text: str) -> bytes:
    """The inverse of format_uuid; also accepts the bare hex form. Raises ValueError."""
    hex_digits = text.removeprefix("GPU-").replace("-", "")
    raw = bytes.fromhex(hex_digits)
    if len(raw) != UUID_BYTES:
        raise ValueError(f"a GPU UUID has {UUID_BYTES} bytes, {text!r} has {len(raw)}")
    return raw


# ---------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Hello:
    gpus: tuple[bytes, ...]
    command: str
    features: int = 0  # Features bits the shim knows


@dataclass(frozen=True, slots=True)
class WireSettings:
    """SETTINGS as it travels (milliseconds); settings.Settings is the agent's own value."""

    anti_thrash: int  # AntiThrashWire
    time_quantum_ms: int
    idle_release_ms: int
    drop_grace_ms: int


@dataclass(slots=True)  # not frozen: built for every lock frame, and frozen init is slower
class LockMessage:
    """LOCK_REQUEST, LOCK_GRANT, DROP_REQUEST, RELEASED or REVOKED."""

    type: int
    gpu: bytes
    lease: int
    flags: int = 0
    idle_ms: int = 0


@dataclass(frozen=True, slots=True)
class MemoryReport:
    gpu: bytes
    managed_bytes: int
    unmanaged_bytes: int


@dataclass(frozen=True, slots=True)
class Error:
    code: int
    text: str


@dataclass(frozen=True, slots=True)
class Welcome:
    features: int  # Features bits the agent does
    keepalive_ms: int


@dataclass(frozen=True, slots=True)
class GpuMemory:
    gpu: bytes
    total_bytes: int


@dataclass(frozen=True, slots=True)
class Keepalive:
    waiting_gpus: int


@dataclass(frozen=True, slots=True)
class GpuUsage:
    gpu: bytes
    busy_us: int  # a running total since the connection's HELLO


@dataclass(frozen=True, slots=True)
class MemoryCap:
    gpu: bytes
    cap_bytes: int  # 0: no cap
    others_bytes: int  # what the share group's other processes hold on gpu


@dataclass(frozen=True, slots=True)
class FairSlot:
    gpu: bytes
    slot: int  # this process's in the GPU's fair page
    weight: int


#: Every decoded frame is one of these.
Message = (
    Hello
    | WireSettings
    | LockMessage
    | MemoryReport
    | Error
    | Welcome
    | GpuMemory
    | Keepalive
    | GpuUsage
    | MemoryCap
    | FairSlot
)


# ---------------------------------------------------------------- encoding


def encode_header(
    msg_type: int,
    payload_bytes: int,
    *,
    magic: int = MAGIC,
    version: int = VERSION,
    reserved: int = 0,
) -> bytes:
    """A raw header; the keyword arguments exist so tests can forge bad ones."""
    h = ffi.new("struct nvshare_header *")
    h.magic, h.version, h.type = magic, version, msg_type
    h.payload_bytes, h.reserved = payload_bytes, reserved
    return bytes(ffi.buffer(h))


# Every type's header is a constant: build each once.
_HEADER: dict[int, bytes] = {t: encode_header(t, n) for t, n in PAYLOAD_BYTES.items()}


def _frame(msg_type: int, payload: Any) -> bytes:
    """payload: a cffi pointer to the type's struct."""
    return _HEADER[msg_type] + bytes(ffi.buffer(payload))


def encode_hello(gpus: Iterable[bytes], command: str, features: int = 0) -> bytes:
    gpus = list(gpus)
    if len(gpus) > MAX_GPUS:
        raise ValueError(f"at most {MAX_GPUS} GPUs fit in a hello, got {len(gpus)}")
    p = ffi.new("struct nvshare_hello *")
    p.gpu_count = len(gpus)
    for i, raw in enumerate(gpus):
        p.gpus[i].bytes = raw
    p.command = command.encode()[:COMMAND_BYTES]
    p.features = features
    return _frame(MessageType.HELLO, p)


def encode_settings(
    *, anti_thrash: int, time_quantum_ms: int, idle_release_ms: int, drop_grace_ms: int
) -> bytes:
    """anti_thrash: an AntiThrashWire value (True and False still mean on and off)."""
    p = ffi.new("struct nvshare_settings *")
    p.anti_thrash = int(anti_thrash)
    p.time_quantum_ms, p.idle_release_ms, p.drop_grace_ms = (
        time_quantum_ms,
        idle_release_ms,
        drop_grace_ms,
    )
    return _frame(MessageType.SETTINGS, p)


def encode_lock(
    msg_type: int, gpu: bytes, lease: int = 0, flags: int = 0, idle_ms: int = 0
) -> bytes:
    return _HEADER[msg_type] + LOCK_STRUCT.pack(gpu, lease, flags, idle_ms)


def encode_memory_report(gpu: bytes, managed_bytes: int, unmanaged_bytes: int = 0) -> bytes:
    p = ffi.new("struct nvshare_memory_report *")
    p.gpu.bytes = gpu
    p.managed_bytes, p.unmanaged_bytes = managed_bytes, unmanaged_bytes
    return _frame(MessageType.MEMORY_REPORT, p)


def encode_welcome(features: int, keepalive_ms: int) -> bytes:
    p = ffi.new("struct nvshare_welcome *")
    p.features, p.keepalive_ms = features, keepalive_ms
    return _frame(MessageType.WELCOME, p)


def encode_gpu_memory(gpu: bytes, total_bytes: int) -> bytes:
    p = ffi.new("struct nvshare_gpu_memory *")
    p.gpu.bytes = gpu
    p.total_bytes = total_bytes
    return _frame(MessageType.GPU_MEMORY, p)


def encode_gpu_usage(gpu: bytes, busy_us: int) -> bytes:
    """What a shim sends; here for fake shims in tests and benches."""
    p = ffi.new("struct nvshare_gpu_usage *")
    p.gpu.bytes = gpu
    p.busy_us = busy_us
    return _frame(MessageType.GPU_USAGE, p)


def encode_memory_cap(gpu: bytes, cap_bytes: int, others_bytes: int) -> bytes:
    p = ffi.new("struct nvshare_memory_cap *")
    p.gpu.bytes = gpu
    p.cap_bytes, p.others_bytes = cap_bytes, others_bytes
    return _frame(MessageType.MEMORY_CAP, p)


def encode_fair_slot(gpu: bytes, slot: int, weight: int) -> bytes:
    p = ffi.new("struct nvshare_fair_slot *")
    p.gpu.bytes = gpu
    p.slot, p.weight = slot, weight
    return _frame(MessageType.FAIR_SLOT, p)


def encode_keepalive(waiting_gpus: int) -> bytes:
    p = ffi.new("struct nvshare_keepalive *")
    p.waiting_gpus = waiting_gpus
    return _frame(MessageType.KEEPALIVE, p)


def encode_error(code: int, text: str) -> bytes:
    p = ffi.new("struct nvshare_error *")
    p.code = code
    # Keep room for the terminating NUL the header promises.
    p.text = text.encode(errors="replace")[: ERROR_TEXT_BYTES - 1]
    return _frame(MessageType.ERROR, p)


# ---------------------------------------------------------------- decoding


def _c_string(char_array: Any) -> str:
    return str(ffi.string(char_array).decode(errors="replace"))


def decode_payload(msg_type: int, payload: bytes, offset: int = 0) -> Message:
    """Turn a checked payload (see FrameReader) into one of the message classes."""
    if msg_type in _LOCK_TYPE_SET:
        gpu, lease, flags, idle_ms = LOCK_STRUCT.unpack_from(payload, offset)
        return LockMessage(msg_type, gpu, lease, flags, idle_ms)
    start = ffi.from_buffer(payload) + offset
    if msg_type == MessageType.HELLO:
        m = ffi.cast("struct nvshare_hello *", start)
        if m.gpu_count > MAX_GPUS:
            raise ProtocolError(
                ErrorCode.BAD_FRAME, f"hello lists {m.gpu_count} GPUs, at most {MAX_GPUS} allowed"
            )
        gpus = tuple(ffi.buffer(m.gpus[i].bytes)[:] for i in range(m.gpu_count))
        return Hello(gpus, _c_string(m.command), m.features)
    if msg_type == MessageType.SETTINGS:
        m = ffi.cast("struct nvshare_settings *", start)
        return WireSettings(m.anti_thrash, m.time_quantum_ms, m.idle_release_ms, m.drop_grace_ms)
    if msg_type == MessageType.MEMORY_REPORT:
        m = ffi.cast("struct nvshare_memory_report *", start)
        gpu_at = offset + _REPORT_GPU_OFFSET
        return MemoryReport(
            payload[gpu_at : gpu_at + UUID_BYTES], m.managed_bytes, m.unmanaged_bytes
        )
    if msg_type == MessageType.ERROR:
        m = ffi.cast("struct nvshare_error *", start)
        return Error(m.code, _c_string(m.text))
    if msg_type == MessageType.WELCOME:
        m = ffi.cast("struct nvshare_welcome *", start)
        return Welcome(m.features, m.keepalive_ms)
    if msg_type == MessageType.GPU_MEMORY:
        m = ffi.cast("struct nvshare_gpu_memory *", start)
        return GpuMemory(ffi.buffer(m.gpu.bytes)[:], m.total_bytes)
    if msg_type == MessageType.KEEPALIVE:
        m = ffi.cast("struct nvshare_keepalive *", start)
        return Keepalive(m.waiting_gpus)
    if msg_type == MessageType.GPU_USAGE:
        m = ffi.cast("struct nvshare_gpu_usage *", start)
        return GpuUsage(ffi.buffer(m.gpu.bytes)[:], m.busy_us)
    if msg_type == MessageType.MEMORY_CAP:
        m = ffi.cast("struct nvshare_memory_cap *", start)
        return MemoryCap(ffi.buffer(m.gpu.bytes)[:], m.cap_bytes, m.others_bytes)
    if msg_type == MessageType.FAIR_SLOT:
        m = ffi.cast("struct nvshare_fair_slot *", start)
        return FairSlot(ffi.buffer(m.gpu.bytes)[:], m.slot, m.weight)
    raise ProtocolError(ErrorCode.BAD_FRAME, f"unknown message type {msg_type}")


class FrameReader:
    """Splits a byte stream into checked (type, payload) frames.

    feed() returns the complete frames found so far as decoded messages and
    keeps any partial frame for the next call.  Any frame that breaks the
    rules raises ProtocolError (carrying the good frames before it in
    .messages); the stream cannot be resynchronised after that, so the caller
    closes the connection.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[Message]:
        if self._pending:
            data = self._pending + data
        messages: list[Message] = []
        size = len(data)
        offset = 0
        unpack_header = HEADER_STRUCT.unpack_from
        try:
            while size - offset >= HEADER_BYTES:
                magic, version, msg_type, payload_bytes, _reserved = unpack_header(data, offset)
                if (
                    msg_type in _LOCK_TYPE_SET
                    and payload_bytes == _LOCK_PAYLOAD_BYTES
                    and magic == MAGIC
                    and version == VERSION
                ):
                    end = offset + HEADER_BYTES + _LOCK_PAYLOAD_BYTES
                    if end > size:
                        break
                    gpu, lease, flags, idle_ms = LOCK_STRUCT.unpack_from(
                        data, offset + HEADER_BYTES
                    )
                    messages.append(LockMessage(msg_type, gpu, lease, flags, idle_ms))
                    offset = end
                    continue
                expected = check_header(magic, version, msg_type, payload_bytes)
                end = offset + HEADER_BYTES + expected
                if end > size:
                    break
                messages.append(decode_payload(msg_type, data, offset + HEADER_BYTES))
                offset = end
        except ProtocolError as e:
            self._pending = b""
            e.messages = messages
            raise
        self._pending = data[offset:] if offset < size else b""
        return messages


def check_header(magic: int, version: int, msg_type: int, payload_bytes: int) -> int:
    """Validate one header; returns the payload size or raises ProtocolError."""
    if magic != MAGIC:
        raise ProtocolError(ErrorCode.BAD_MAGIC, f"bad magic 0x{magic:08x}, not an nvshare peer")
    if version != VERSION:
        raise ProtocolError(
            ErrorCode.VERSION_MISMATCH, f"protocol version {version}, this agent speaks {VERSION}"
        )
    expected = PAYLOAD_BYTES.get(msg_type)
    if expected is None:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"unknown message type {msg_type}")
    if payload_bytes != expected:
        if payload_bytes > MAX_PAYLOAD_BYTES:
            reason = f"payload of {payload_bytes} bytes, the limit is {MAX_PAYLOAD_BYTES}"
        else:
            reason = (
                f"{MessageType(msg_type).name} payload of {payload_bytes} bytes,"
                f" expected {expected}"
            )
        raise ProtocolError(ErrorCode.BAD_FRAME, reason)
    return expected
