"""The wire format's layout, read from the one C header that the shim also compiles.

shim/nvshare_protocol.h (shipped beside this module as package data) holds the
layout between its BEGIN/END markers; we hand that text to cffi's ffi.cdef, so
there is no second copy of any layout here: the constants, the enums (spelled
out for readers and the type checker, valued from the header and checked against
it at import) and each message type's struct and size.  protocol.py builds the
messages, their encoding and decoding on it, and re-exports these names: import
them from there.
"""

from __future__ import annotations

import enum
import importlib
import importlib.resources
import re
import struct
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import cffi

BEGIN_MARKER = "/* BEGIN NVSHARE WIRE FORMAT */"
END_MARKER = "/* END NVSHARE WIRE FORMAT */"


_HEADER_TEXT = importlib.resources.files(__package__).joinpath("nvshare_protocol.h").read_text()


def wire_format_text() -> str:
    """The header's text between its markers: what cffi parses (tools/wire_cache.py too)."""
    start = _HEADER_TEXT.index(BEGIN_MARKER) + len(BEGIN_MARKER)
    return _HEADER_TEXT[start : _HEADER_TEXT.index(END_MARKER)]


def _string_define(name: str) -> str:
    """A #define of a string outside the wire format (cffi takes no string constants)."""
    match = re.search(rf'^#define {name} "([^"]*)"$', _HEADER_TEXT, re.MULTILINE)
    if match is None:
        raise AssertionError(f"nvshare_protocol.h defines no string {name}")
    return match.group(1)


def _parsed(text: str) -> cffi.FFI:
    """cffi's parse of the wire format: from the cache `make` writes (tools/wire_cache.py)
    where it was made from this very text, else parsed here (~20 ms of pycparser a
    process: the package, and a checkout before `make`)."""
    try:
        cache = importlib.import_module(f"{__package__}._wire_ffi")
        if text == cache.WIRE_FORMAT:
            return cast("cffi.FFI", cache.ffi)
    except Exception:  # none made, made by another cffi, or damaged: it is only a cache
        pass
    import cffi

    parsed = cffi.FFI()
    parsed.cdef(text)
    return parsed


ffi = _parsed(wire_format_text())
_lib = ffi.dlopen(None)  # only to read the #define constants; no symbols are used

MAGIC: int = _lib.NVSHARE_MAGIC
VERSION: int = _lib.NVSHARE_PROTOCOL_VERSION
MAX_GPUS: int = _lib.NVSHARE_MAX_GPUS
UUID_BYTES: int = _lib.NVSHARE_UUID_BYTES
COMMAND_BYTES: int = _lib.NVSHARE_COMMAND_BYTES
ERROR_TEXT_BYTES: int = _lib.NVSHARE_ERROR_TEXT_BYTES
MAX_PAYLOAD_BYTES: int = _lib.NVSHARE_MAX_PAYLOAD_BYTES
HEADER_BYTES: int = ffi.sizeof("struct nvshare_header")
DEFAULT_DROP_GRACE_MS: int = _lib.NVSHARE_DEFAULT_DROP_GRACE_MS
#: Where the agent listens and shims connect unless told otherwise.
DEFAULT_SOCKET_PATH: str = _string_define("NVSHARE_DEFAULT_SOCKET_PATH")


def _enumerators(c_enum: str, prefix: str) -> dict[str, int]:
    return {k[len(prefix) :]: v for k, v in ffi.typeof(c_enum).relements.items()}


def _c(c_enum: str, name: str) -> int:
    return int(ffi.typeof(c_enum).relements[name])


def _matches_header(cls: type[enum.IntEnum], c_enum: str, prefix: str) -> None:
    ours = {member.name: member.value for member in cls}
    theirs = _enumerators(c_enum, prefix)
    if ours != theirs:
        raise AssertionError(f"{cls.__name__} disagrees with {c_enum}: {ours} != {theirs}")


# The enums are spelled out (for readers and the type checker) but valued from
# the header, and checked against it below: an enumerator added on one side
# only fails at import.
_MSG = "enum nvshare_message_type"


class MessageType(enum.IntEnum):
    HELLO = _c(_MSG, "NVSHARE_MSG_HELLO")
    SETTINGS = _c(_MSG, "NVSHARE_MSG_SETTINGS")
    LOCK_REQUEST = _c(_MSG, "NVSHARE_MSG_LOCK_REQUEST")
    LOCK_GRANT = _c(_MSG, "NVSHARE_MSG_LOCK_GRANT")
    DROP_REQUEST = _c(_MSG, "NVSHARE_MSG_DROP_REQUEST")
    RELEASED = _c(_MSG, "NVSHARE_MSG_RELEASED")
    REVOKED = _c(_MSG, "NVSHARE_MSG_REVOKED")
    MEMORY_REPORT = _c(_MSG, "NVSHARE_MSG_MEMORY_REPORT")
    ERROR = _c(_MSG, "NVSHARE_MSG_ERROR")
    WELCOME = _c(_MSG, "NVSHARE_MSG_WELCOME")
    GPU_MEMORY = _c(_MSG, "NVSHARE_MSG_GPU_MEMORY")
    KEEPALIVE = _c(_MSG, "NVSHARE_MSG_KEEPALIVE")
    GPU_USAGE = _c(_MSG, "NVSHARE_MSG_GPU_USAGE")
    MEMORY_CAP = _c(_MSG, "NVSHARE_MSG_MEMORY_CAP")
    FAIR_SLOT = _c(_MSG, "NVSHARE_MSG_FAIR_SLOT")


class GrantFlags(enum.IntEnum):
    EXCLUSIVE = _c("enum nvshare_grant_flags", "NVSHARE_GRANT_EXCLUSIVE")
    SHARED = _c("enum nvshare_grant_flags", "NVSHARE_GRANT_SHARED")
    RELEASE_WHEN_IDLE = _c("enum nvshare_grant_flags", "NVSHARE_GRANT_RELEASE_WHEN_IDLE")
    SHORT_QUEUE = _c("enum nvshare_grant_flags", "NVSHARE_GRANT_SHORT_QUEUE")
    DISPLACED = _c("enum nvshare_grant_flags", "NVSHARE_GRANT_DISPLACED")


class DropFlags(enum.IntEnum):
    WHEN_IDLE = _c("enum nvshare_drop_flags", "NVSHARE_DROP_WHEN_IDLE")


class Features(enum.IntEnum):
    YIELD = _c("enum nvshare_features", "NVSHARE_FEATURE_YIELD")
    GPU_MEMORY = _c("enum nvshare_features", "NVSHARE_FEATURE_GPU_MEMORY")
    KEEPALIVE = _c("enum nvshare_features", "NVSHARE_FEATURE_KEEPALIVE")
    USAGE = _c("enum nvshare_features", "NVSHARE_FEATURE_USAGE")
    MEMORY_CAP = _c("enum nvshare_features", "NVSHARE_FEATURE_MEMORY_CAP")
    FAIR = _c("enum nvshare_features", "NVSHARE_FEATURE_FAIR")


class AntiThrashWire(enum.IntEnum):
    OFF = _c("enum nvshare_anti_thrash", "NVSHARE_ANTI_THRASH_OFF")
    ON = _c("enum nvshare_anti_thrash", "NVSHARE_ANTI_THRASH_ON")
    AUTO = _c("enum nvshare_anti_thrash", "NVSHARE_ANTI_THRASH_AUTO")


class ErrorCode(enum.IntEnum):
    BAD_MAGIC = _c("enum nvshare_error_code", "NVSHARE_ERR_BAD_MAGIC")
    VERSION_MISMATCH = _c("enum nvshare_error_code", "NVSHARE_ERR_VERSION_MISMATCH")
    BAD_FRAME = _c("enum nvshare_error_code", "NVSHARE_ERR_BAD_FRAME")
    PROTOCOL = _c("enum nvshare_error_code", "NVSHARE_ERR_PROTOCOL")
    FLOOD = _c("enum nvshare_error_code", "NVSHARE_ERR_FLOOD")


for _enum_class, _c_enum, _prefix in (
    (MessageType, _MSG, "NVSHARE_MSG_"),
    (GrantFlags, "enum nvshare_grant_flags", "NVSHARE_GRANT_"),
    (DropFlags, "enum nvshare_drop_flags", "NVSHARE_DROP_"),
    (Features, "enum nvshare_features", "NVSHARE_FEATURE_"),
    (AntiThrashWire, "enum nvshare_anti_thrash", "NVSHARE_ANTI_THRASH_"),
    (ErrorCode, "enum nvshare_error_code", "NVSHARE_ERR_"),
):
    _matches_header(_enum_class, _c_enum, _prefix)


LOCK_TYPES = (
    MessageType.LOCK_REQUEST,
    MessageType.LOCK_GRANT,
    MessageType.DROP_REQUEST,
    MessageType.RELEASED,
    MessageType.REVOKED,
)

#: The C struct that each message type carries.
PAYLOAD_STRUCT: dict[int, str] = {
    MessageType.HELLO: "struct nvshare_hello",
    MessageType.SETTINGS: "struct nvshare_settings",
    MessageType.MEMORY_REPORT: "struct nvshare_memory_report",
    MessageType.ERROR: "struct nvshare_error",
    MessageType.WELCOME: "struct nvshare_welcome",
    MessageType.GPU_MEMORY: "struct nvshare_gpu_memory",
    MessageType.KEEPALIVE: "struct nvshare_keepalive",
    MessageType.GPU_USAGE: "struct nvshare_gpu_usage",
    MessageType.MEMORY_CAP: "struct nvshare_memory_cap",
    MessageType.FAIR_SLOT: "struct nvshare_fair_slot",
    **{t: "struct nvshare_lock_message" for t in LOCK_TYPES},
}
#: Payload size in bytes for each message type; any other size is a bad frame.
PAYLOAD_BYTES: dict[int, int] = {t: ffi.sizeof(s) for t, s in PAYLOAD_STRUCT.items()}


_PRIMITIVE_CODES = {"uint8_t": "B", "uint16_t": "H", "uint32_t": "I", "uint64_t": "Q"}


def derived_struct(c_type: str) -> struct.Struct:
    """A struct.Struct generated from cffi's parse of the header, not written by hand.

    The hot path (every lock frame) decodes and encodes through it: it is
    several times faster than cffi casts.  Only flat structs of fixed-width
    integers and nested byte blobs (the GPU UUID) are supported; padding
    between fields comes from the offsets cffi computed, so the two agree by
    construction, and the size is checked against ffi.sizeof."""
    ctype = ffi.typeof(c_type)
    codes, at = ["="], 0
    for _name, field in ctype.fields:
        if field.offset > at:
            codes.append(f"{field.offset - at}x")
        if field.type.kind == "primitive":
            codes.append(_PRIMITIVE_CODES[field.type.cname])
        else:  # nested struct or array: raw bytes
            codes.append(f"{ffi.sizeof(field.type)}s")
        at = field.offset + ffi.sizeof(field.type)
    if ffi.sizeof(ctype) > at:
        codes.append(f"{ffi.sizeof(ctype) - at}x")
    result = struct.Struct("".join(codes))
    if result.size != ffi.sizeof(ctype):
        raise AssertionError(f"{c_type}: derived layout {result.format} disagrees with cffi")
    return result


HEADER_STRUCT = derived_struct(
    "struct nvshare_header"
)  # magic, version, type, payload_bytes, reserved
LOCK_STRUCT = derived_struct("struct nvshare_lock_message")  # gpu, lease, flags, idle_ms
