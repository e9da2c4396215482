"""The wire format as the agent reads it from shim/nvshare_protocol.h."""

from __future__ import annotations

import random
import re

import pytest
from agent_harness import GPU0, GPU1

from nvshare_agent import protocol
from nvshare_agent.protocol import ErrorCode, FrameReader, MessageType, ProtocolError, ffi


def test_layout_matches_the_static_asserts_in_the_header():
    sizes = {
        "struct nvshare_header": 16,
        "struct nvshare_hello": 296,
        "struct nvshare_settings": 16,
        "struct nvshare_lock_message": 32,
        "struct nvshare_memory_report": 32,
        "struct nvshare_error": 136,
    }
    for c_type, size in sizes.items():
        assert ffi.sizeof(c_type) == size


def test_fast_path_structs_agree_with_cffi_field_by_field():
    h = ffi.new(
        "struct nvshare_header *",
        {
            "magic": 0x01020304,
            "version": 0x0506,
            "type": 0x0708,
            "payload_bytes": 0x090A0B0C,
            "reserved": 0x0D0E0F10,
        },
    )
    assert protocol.HEADER_STRUCT.unpack(ffi.buffer(h)[:]) == (
        0x01020304,
        0x0506,
        0x0708,
        0x090A0B0C,
        0x0D0E0F10,
    )
    m = ffi.new("struct nvshare_lock_message *")
    m.gpu.bytes = GPU1
    m.lease, m.flags, m.idle_ms = 2**63 + 5, 7, 9
    assert protocol.LOCK_STRUCT.unpack(ffi.buffer(m)[:]) == (GPU1, 2**63 + 5, 7, 9)


def test_every_message_round_trips():
    frames = (
        protocol.encode_hello([GPU0, GPU1], "python3 train.py")
        + protocol.encode_settings(
            anti_thrash=False, time_quantum_ms=30000, idle_release_ms=1000, drop_grace_ms=5000
        )
        + b"".join(protocol.encode_lock(t, GPU1, 42, 2) for t in (3, 4, 5, 6, 7))
        + protocol.encode_memory_report(GPU0, 1 << 40, 12345)
        + protocol.encode_error(ErrorCode.FLOOD, "too many frames")
    )
    # Fed in awkward pieces, the stream must decode the same.
    reader, messages, rng = FrameReader(), [], random.Random(1)
    at = 0
    while at < len(frames):
        step = rng.randint(1, 40)
        messages += reader.feed(frames[at : at + step])
        at += step
    assert messages[0] == protocol.Hello((GPU0, GPU1), "python3 train.py")
    assert messages[1] == protocol.WireSettings(False, 30000, 1000, 5000)
    assert [m.type for m in messages[2:7]] == [3, 4, 5, 6, 7]
    assert all(m.gpu == GPU1 and m.lease == 42 and m.flags == 2 for m in messages[2:7])
    assert messages[7] == protocol.MemoryReport(GPU0, 1 << 40, 12345)
    assert messages[8] == protocol.Error(ErrorCode.FLOOD, "too many frames")


def test_command_and_error_text_are_truncated_to_fit():
    (hello,) = FrameReader().feed(protocol.encode_hello([GPU0], "x" * 100))
    assert hello.command == "x" * protocol.COMMAND_BYTES
    (error,) = FrameReader().feed(protocol.encode_error(1, "y" * 500))
    assert error.text == "y" * (protocol.ERROR_TEXT_BYTES - 1)


def test_good_frames_before_a_bad_one_are_kept():
    good = protocol.encode_lock(MessageType.RELEASED, GPU0, 3)
    with pytest.raises(ProtocolError) as caught:
        FrameReader().feed(good + b"\xff" * 16)
    assert caught.value.code == ErrorCode.BAD_MAGIC
    assert [m.lease for m in caught.value.messages] == [3]


def test_uuid_formatting_matches_nvml():
    raw = bytes.fromhex("5c1e02ff9d1a4b3c8e2f000011112222")
    assert protocol.format_uuid(raw) == "GPU-5c1e02ff-9d1a-4b3c-8e2f-000011112222"
    assert protocol.parse_uuid("GPU-5c1e02ff-9d1a-4b3c-8e2f-000011112222") == raw
    with pytest.raises(ValueError):
        protocol.parse_uuid("GPU-1234")


def test_enums_come_from_the_header():
    assert MessageType.HELLO == 1 and MessageType.ERROR == 9
    assert protocol.GrantFlags.SHARED == 2
    assert ErrorCode.VERSION_MISMATCH == 2
    assert protocol.MAGIC.to_bytes(4, "little") == b"NVSH"


def _layout(parsed, text: str) -> dict:
    """Everything the agent reads of a parse: each struct's fields (offset, type, size),
    each enum's values, each #define."""
    constants = parsed.dlopen(None)
    return {
        "structs": {
            name: [
                (field, f.offset, f.type.cname, parsed.sizeof(f.type))
                for field, f in parsed.typeof(f"struct {name}").fields
            ]
            for name in parsed.list_types()[1]
        },
        "enums": {
            name: dict(parsed.typeof(f"enum {name}").relements)
            for name in re.findall(r"^enum (\w+) \{", text, re.MULTILINE)
        },
        "defines": {name: getattr(constants, name) for name in dir(constants)},
    }


def test_the_made_cache_is_the_headers_own_parse(tmp_path):
    """make's cache of cffi's parse (tools/wire_cache.py) reads as the header parsed
    at start does, struct by struct, enum by enum, define by define."""
    import importlib.util
    import sys
    from pathlib import Path

    import cffi

    from nvshare_agent import wire_layout

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    try:
        import wire_cache
    finally:
        sys.path.pop(0)
    wire_cache.write(tmp_path / "made.py")
    spec = importlib.util.spec_from_file_location("made", tmp_path / "made.py")
    made = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(made)
    text = wire_layout.wire_format_text()
    assert text == made.WIRE_FORMAT
    parsed = cffi.FFI()
    parsed.cdef(text)
    ours = _layout(made.ffi, text)
    assert ours == _layout(parsed, text)
    assert ours["structs"]["nvshare_hello"] and ours["enums"]["nvshare_message_type"]
    assert ours["defines"]["NVSHARE_MAGIC"]  # not two empty readings


def test_a_cache_made_from_another_header_is_not_used(monkeypatch):
    import sys
    import types

    from nvshare_agent import wire_layout

    stale = types.SimpleNamespace(WIRE_FORMAT="struct old { int a; };", ffi="not this")
    monkeypatch.setitem(sys.modules, "nvshare_agent._wire_ffi", stale)
    parsed = wire_layout._parsed(wire_layout.wire_format_text())
    assert parsed != "not this"
    assert parsed.sizeof("struct nvshare_hello") == 296
