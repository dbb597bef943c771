"""The harness's Noise primitives and the hybrid IK handshake (initiator against the responder
half written from the same facts; the real executor is the contract test's job)."""

from __future__ import annotations

import hashlib
import struct

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from agents_simulator import noise


def test_hkdf_is_rfc5869_with_the_chaining_key_as_salt() -> None:
    ck, ikm = bytes(range(32)), b"input key material"
    expected = HKDF(algorithm=hashes.SHA256(), length=96, salt=ck, info=b"").derive(ikm)
    assert b"".join(noise.hkdf(ck, ikm, 2)) == expected[:64]
    assert b"".join(noise.hkdf(ck, ikm, 3)) == expected


def test_nonce_is_four_zero_bytes_then_a_big_endian_counter() -> None:
    assert noise.nonce(0).hex() == "00" * 12
    assert noise.nonce(1).hex() == "00" * 11 + "01"
    assert noise.nonce(0x0102030405060708).hex() == "00000000" + "0102030405060708"


def test_symmetric_state_starts_from_the_hashed_protocol_name() -> None:
    state = noise.SymmetricState()
    assert len(noise.PROTOCOL_NAME) > 32
    assert state.h == state.ck == hashlib.sha256(b"Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256").digest()
    short = noise.SymmetricState(b"Noise_short")
    assert short.h == b"Noise_short" + b"\x00" * 21


def test_mix_hash_mix_key_and_encrypt_and_hash() -> None:
    state = noise.SymmetricState()
    h0 = state.h
    state.mix_hash(b"abc")
    assert state.h == hashlib.sha256(h0 + b"abc").digest()
    # Without a key, encrypt_and_hash passes the plaintext through (and hashes it).
    h1 = state.h
    assert state.encrypt_and_hash(b"clear") == b"clear"
    assert state.h == hashlib.sha256(h1 + b"clear").digest()
    ck = state.ck
    state.mix_key(b"secret")
    new_ck, key = noise.hkdf(ck, b"secret", 2)
    assert state.ck == new_ck
    h2 = state.h
    sealed = state.encrypt_and_hash(b"payload")
    assert sealed == AESGCM(key).encrypt(noise.nonce(0), b"payload", h2)  # AD = h before
    assert state.h == hashlib.sha256(h2 + sealed).digest()
    assert state.encrypt_and_hash(b"again") == AESGCM(key).encrypt(noise.nonce(1), b"again", state_h_before(h2, sealed))


def state_h_before(h: bytes, sealed: bytes) -> bytes:
    return hashlib.sha256(h + sealed).digest()


def test_mix_key_and_hash_mixes_the_second_output_into_h() -> None:
    state = noise.SymmetricState()
    h, ck = state.h, state.ck
    state.mix_key_and_hash(b"kem secret")
    new_ck, temp_h, key = noise.hkdf(ck, b"kem secret", 3)
    assert state.ck == new_ck
    assert state.h == hashlib.sha256(h + temp_h).digest()
    assert state.cipher.key == key


def test_decrypt_and_hash_refuses_a_tampered_record() -> None:
    sender, receiver = noise.SymmetricState(), noise.SymmetricState()
    for state in (sender, receiver):
        state.mix_key(b"k")
    sealed = bytearray(sender.encrypt_and_hash(b"hello"))
    sealed[0] ^= 1
    with pytest.raises(noise.NoiseError):
        receiver.decrypt_and_hash(bytes(sealed))


def test_prologue_uses_big_endian_u64_lengths() -> None:
    label = b"codex-exec-server-relay-noise/v1"
    assert noise.prologue("env", "reg", "sid") == (
        struct.pack(">Q", 32) + label + b"\x00" * 7 + b"\x03env" + b"\x00" * 7 + b"\x03reg" + b"\x00" * 7 + b"\x03sid"
    )


def test_hybrid_ik_handshake_sizes_payload_and_transport() -> None:
    """msg1 = skem 1088 + e 32+1184 + s 48+1200 + payload+16; msg2 = 3424; k1/k2 agree."""
    executor, harness = noise.HybridKeyPair(), noise.HybridKeyPair()
    prologue = noise.prologue("env_1", "exreg_1", "stream-1")
    initiator = noise.Initiator(harness, executor.public, prologue)
    responder = noise.Responder(executor, prologue)
    payload = b"hka_authorization"
    message1 = initiator.write_message1(payload)
    assert len(message1) == 1088 + 32 + 1184 + 48 + 1200 + len(payload) + 16
    assert responder.read_message1(message1) == payload
    assert responder.remote_static == harness.public
    message2, executor_side = responder.write_message2()
    assert len(message2) == noise.MSG2_LEN == 3424
    harness_side = initiator.read_message2(message2)
    for n in range(3):
        assert executor_side.open(harness_side.seal(f"to executor {n}".encode())) == f"to executor {n}".encode()
        assert harness_side.open(executor_side.seal(f"to harness {n}".encode())) == f"to harness {n}".encode()
    # Records use empty associated data and the counter nonce.
    record = harness_side.seal(b"x")
    assert AESGCM(harness_side.send.key or b"").decrypt(noise.nonce(3), record, b"") == b"x"


def test_a_different_prologue_or_a_tampered_message2_fails() -> None:
    executor, harness = noise.HybridKeyPair(), noise.HybridKeyPair()
    initiator = noise.Initiator(harness, executor.public, noise.prologue("env", "reg", "a"))
    responder = noise.Responder(executor, noise.prologue("env", "reg", "b"))
    with pytest.raises(noise.NoiseError):
        responder.read_message1(initiator.write_message1(b"x"))

    initiator = noise.Initiator(harness, executor.public, noise.prologue("env", "reg", "a"))
    responder = noise.Responder(executor, noise.prologue("env", "reg", "a"))
    responder.read_message1(initiator.write_message1(b"x"))
    message2, _ = responder.write_message2()
    tampered = bytearray(message2)
    tampered[-1] ^= 1
    with pytest.raises(noise.NoiseError):
        initiator.read_message2(bytes(tampered))
    with pytest.raises(noise.NoiseError):
        initiator.read_message2(message2[:-1])
