"""The executor's relay frames: protobuf ``codex.exec_server.relay.v1.RelayMessageFrame``.

Hand-written encoder and decoder (varints and length-delimited fields; no protoc)::

    RelayMessageFrame { uint32 version = 1; string stream_id = 2; uint64 ack = 3; uint64 ack_bits = 4;
                        oneof body { RelayData data = 5; RelayAck ack_frame = 6; RelayResume resume = 7;
                                     RelayReset reset = 8; RelayHeartbeat heartbeat = 9;
                                     RelayHandshake handshake = 10; } }
    RelayData { uint64 seq = 1; uint32 segment_index = 2; uint32 segment_count = 3; bytes payload = 4; }
    RelayResume { uint64 next_seq = 1; }   RelayReset { string reason = 1; }
    RelayHandshake { bytes payload = 1; }  RelayAck {}  RelayHeartbeat {}

Proto3 rules: scalars at their default are not written; a oneof member is written even when
empty; unknown fields are skipped when reading.

Above the frames, a stream's plaintext is ``u32 BE length ‖ JSON-RPC bytes``, sealed in
records of at most ``MAX_RECORD`` bytes (``records`` and ``Reassembler``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VERSION = 1
MAX_RECORD = 60 * 1024
MAX_STREAM_ID = 128

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class FrameError(ValueError):
    """Bytes that are not a well-formed frame."""


# --- wire primitives ----------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise FrameError("varints here are unsigned")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    result = shift = 0
    while True:
        if position >= len(data):
            raise FrameError("truncated varint")
        if shift >= 64:
            raise FrameError("varint longer than 10 bytes")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def _key(field: int, wire_type: int) -> bytes:
    return encode_varint(field << 3 | wire_type)


def _uint(field: int, value: int) -> bytes:
    return _key(field, _VARINT) + encode_varint(value) if value else b""


def _bytes(field: int, value: bytes, always: bool = False) -> bytes:
    if not value and not always:
        return b""
    return _key(field, _LENGTH) + encode_varint(len(value)) + value


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """Every (field number, value) in a message: ints for varints, bytes for length-delimited."""
    found: list[tuple[int, int | bytes]] = []
    position = 0
    while position < len(data):
        key, position = decode_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise FrameError("field number 0")
        if wire_type == _VARINT:
            value, position = decode_varint(data, position)
            found.append((number, value))
        elif wire_type == _LENGTH:
            size, position = decode_varint(data, position)
            if position + size > len(data):
                raise FrameError("truncated length-delimited field")
            found.append((number, data[position : position + size]))
            position += size
        elif wire_type == _FIXED64:
            position += 8
        elif wire_type == _FIXED32:
            position += 4
        else:
            raise FrameError(f"unsupported wire type {wire_type}")
        if position > len(data):
            raise FrameError("truncated fixed-width field")
    return found


# --- messages -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Data:
    seq: int
    payload: bytes
    segment_index: int = 0
    segment_count: int = 1


@dataclass(frozen=True)
class Ack:
    pass


@dataclass(frozen=True)
class Resume:
    next_seq: int = 0


@dataclass(frozen=True)
class Reset:
    reason: str = ""


@dataclass(frozen=True)
class Heartbeat:
    pass


@dataclass(frozen=True)
class Handshake:
    payload: bytes


Body = Data | Ack | Resume | Reset | Heartbeat | Handshake


@dataclass(frozen=True)
class Frame:
    stream_id: str
    body: Body | None
    ack: int = 0
    ack_bits: int = 0
    version: int = VERSION


def _encode_body(body: Body) -> tuple[int, bytes]:
    if isinstance(body, Data):
        inner = (
            _uint(1, body.seq) + _uint(2, body.segment_index) + _uint(3, body.segment_count) + _bytes(4, body.payload)
        )
        return 5, inner
    if isinstance(body, Ack):
        return 6, b""
    if isinstance(body, Resume):
        return 7, _uint(1, body.next_seq)
    if isinstance(body, Reset):
        return 8, _bytes(1, body.reason.encode())
    if isinstance(body, Heartbeat):
        return 9, b""
    return 10, _bytes(1, body.payload)


def encode(frame: Frame) -> bytes:
    if len(frame.stream_id.encode()) > MAX_STREAM_ID:
        raise FrameError("stream_id longer than 128 bytes")
    out = _uint(1, frame.version) + _bytes(2, frame.stream_id.encode()) + _uint(3, frame.ack) + _uint(4, frame.ack_bits)
    if frame.body is not None:
        number, inner = _encode_body(frame.body)
        out += _bytes(number, inner, always=True)
    return out


def _ints(data: bytes) -> dict[int, int]:
    return {n: v for n, v in fields(data) if isinstance(v, int)}


def _blobs(data: bytes) -> dict[int, bytes]:
    return {n: v for n, v in fields(data) if isinstance(v, bytes)}


def _decode_body(number: int, inner: bytes) -> Body | None:
    if number == 5:
        ints, blobs = _ints(inner), _blobs(inner)
        return Data(
            seq=ints.get(1, 0),
            segment_index=ints.get(2, 0),
            segment_count=ints.get(3, 0),
            payload=blobs.get(4, b""),
        )
    if number == 6:
        return Ack()
    if number == 7:
        return Resume(next_seq=_ints(inner).get(1, 0))
    if number == 8:
        return Reset(reason=_blobs(inner).get(1, b"").decode(errors="replace"))
    if number == 9:
        return Heartbeat()
    if number == 10:
        return Handshake(payload=_blobs(inner).get(1, b""))
    return None


def decode(data: bytes) -> Frame:
    version = ack = ack_bits = 0
    stream_id = ""
    body: Body | None = None
    for number, value in fields(data):
        if isinstance(value, int):
            if number == 1:
                version = value
            elif number == 3:
                ack = value
            elif number == 4:
                ack_bits = value
        elif number == 2:
            stream_id = value.decode(errors="replace")
        elif 5 <= number <= 10:
            body = _decode_body(number, value)  # the last oneof member wins, as in protobuf
    return Frame(stream_id=stream_id, body=body, ack=ack, ack_bits=ack_bits, version=version)


# --- the plaintext stream -----------------------------------------------------------------


def records(message: bytes, limit: int = MAX_RECORD) -> list[bytes]:
    """One JSON-RPC message as length-prefixed plaintext, cut into records of ≤ ``limit`` bytes."""
    framed = struct.pack(">I", len(message)) + message
    return [framed[i : i + limit] for i in range(0, len(framed), limit)]


class Reassembler:
    """Collects decrypted records and yields complete JSON-RPC messages."""

    def __init__(self, max_message: int = 64 * 1024 * 1024) -> None:
        self._buffer = bytearray()
        self._max = max_message

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        complete = []
        while len(self._buffer) >= 4:
            (size,) = struct.unpack(">I", self._buffer[:4])
            if size > self._max:
                raise FrameError(f"a message of {size} bytes is larger than allowed")
            if len(self._buffer) < 4 + size:
                break
            complete.append(bytes(self._buffer[4 : 4 + size]))
            del self._buffer[: 4 + size]
        return complete
