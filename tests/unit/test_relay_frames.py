"""The executor's relay frames: the hand-written protobuf codec against hand-computed bytes."""

from __future__ import annotations

import struct

import pytest

from agents_simulator import relay
from agents_simulator.relay import Ack, Data, Frame, FrameError, Handshake, Heartbeat, Reset, Resume


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (2**32, "8080808010"),
        (2**64 - 1, "ffffffffffffffffff01"),
    ],
)
def test_varints(value: int, encoded: str) -> None:
    assert relay.encode_varint(value).hex() == encoded
    assert relay.decode_varint(bytes.fromhex(encoded), 0) == (value, len(encoded) // 2)


def test_resume_frame_bytes() -> None:
    """version=1 (08 01), stream_id "ab" (12 02 61 62), an empty resume in field 7 (3a 00)."""
    frame = Frame("ab", Resume())
    assert relay.encode(frame).hex() == "0801" + "12026162" + "3a00"
    assert relay.decode(bytes.fromhex("0801120261623a00")) == frame


def test_handshake_frame_bytes() -> None:
    """Field 10 length-delimited (52), holding field 1 bytes (0a 02 01 02)."""
    frame = Frame("s", Handshake(b"\x01\x02"))
    assert relay.encode(frame).hex() == "0801" + "120173" + "5204" + "0a020102"
    assert relay.decode(relay.encode(frame)) == frame


def test_data_frame_bytes() -> None:
    """seq 300 (08 ac 02), segment_index 0 omitted, segment_count 1 (18 01), payload "x" (22 01 78)."""
    frame = Frame("s", Data(seq=300, payload=b"x"))
    inner = "08ac02" + "1801" + "220178"
    assert relay.encode(frame).hex() == "0801" + "120173" + "2a08" + inner
    assert relay.decode(relay.encode(frame)) == frame
    first = Frame("s", Data(seq=0, payload=b"x"))
    assert relay.encode(first).hex() == "0801" + "120173" + "2a05" + "1801220178"


def test_reset_ack_heartbeat_and_ack_fields() -> None:
    assert relay.encode(Frame("s", Reset("no"))).hex() == "0801120173" + "4204" + "0a026e6f"
    assert relay.encode(Frame("s", Ack(), ack=5, ack_bits=3)).hex() == "0801120173" + "1805" + "2003" + "3200"
    assert relay.encode(Frame("s", Heartbeat())).hex() == "0801120173" + "4a00"
    for frame in (Frame("s", Reset("no")), Frame("s", Ack(), ack=5, ack_bits=3), Frame("s", Heartbeat())):
        assert relay.decode(relay.encode(frame)) == frame


def test_unknown_fields_are_skipped_and_bad_bytes_refused() -> None:
    # field 15 varint (78 07), field 14 fixed64 (71 + 8 bytes), field 13 fixed32 (6d + 4 bytes), then a resume
    data = bytes.fromhex("7807" + "71" + "00" * 8 + "6d" + "00" * 4 + "0801120161" + "3a020805")
    assert relay.decode(data) == Frame("a", Resume(next_seq=5))
    with pytest.raises(FrameError):
        relay.decode(bytes.fromhex("1205616263"))  # length 5, only 3 bytes
    with pytest.raises(FrameError):
        relay.decode(bytes.fromhex("08"))  # truncated varint
    with pytest.raises(FrameError):
        relay.encode(Frame("x" * 129, Resume()))


def test_records_are_length_prefixed_and_at_most_60_kib() -> None:
    message = bytes(range(256)) * 508  # 130048 bytes
    parts = relay.records(message)
    assert [len(p) for p in parts] == [61440, 61440, 130052 - 2 * 61440]
    assert parts[0][:4] == struct.pack(">I", len(message))
    joined = b"".join(parts)
    reassembler = relay.Reassembler()
    got = []
    for start in range(0, len(joined), 1000):  # any cut of the records gives the message back once
        got += reassembler.feed(joined[start : start + 1000])
    assert got == [message]
    assert relay.Reassembler().feed(relay.records(b"{}")[0] + relay.records(b"[]")[0]) == [b"{}", b"[]"]
