"""The harness's side of the executor's Noise handshake, as codex 0.171.0 accepts it.

Protocol ``Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256``: X25519 and ML-KEM-768 mixed into one
symmetric state, AES-256-GCM, SHA-256. The harness is the initiator; the executor (the
responder) published its static X25519 and ML-KEM-768 public keys when it registered::

    <- s                                   (pre-message: X25519 key, then ML-KEM key)
    -> skem, e, es, s, ss   + payload      (payload: the harness key authorization)
    <- ekem, skem, e, ee, se               (this order, as 0.171.0 sends it)

Hybrid tokens: ``e`` and ``s`` carry an X25519 key then an ML-KEM key; ``ekem`` encapsulates
to the peer's ephemeral ML-KEM key (ciphertext mix_hash'ed in the clear, secret mix_key'ed);
``skem`` encapsulates to the peer's static ML-KEM key (ciphertext through encrypt_and_hash,
secret through mix_key_and_hash). The prologue binds the handshake to its relay stream with
big-endian u64 lengths. After the handshake ``split`` gives k1 (harness → executor) and k2
(executor → harness); each transport record is AES-256-GCM with nonce ``0000 ‖ u64 BE counter``
and empty associated data.

Only primitives from ``cryptography`` (≥ 50 for ML-KEM-768); no I/O here.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey, MLKEM768PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PROTOCOL_NAME = b"Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256"
PROLOGUE_LABEL = b"codex-exec-server-relay-noise/v1"
SUITE = "Noise_hybridIK_X25519+MLKEM768_AESGCM_SHA256"  # the JSON label (it says X25519)
HASH_LEN = 32
TAG_LEN = 16
DH_LEN = 32
KEM_PUBLIC_LEN = 1184
KEM_CIPHERTEXT_LEN = 1088
MAX_NONCE = 2**64 - 1
MSG2_LEN = KEM_CIPHERTEXT_LEN + (KEM_CIPHERTEXT_LEN + TAG_LEN) + DH_LEN + KEM_PUBLIC_LEN + TAG_LEN  # 3424


class NoiseError(Exception):
    """A handshake or transport message that does not decrypt or parse: drop the stream."""


def hmac_sha256(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def hkdf(chaining_key: bytes, ikm: bytes, outputs: int) -> tuple[bytes, ...]:
    """Noise's HKDF (HMAC-SHA256): two or three 32-byte outputs."""
    temp = hmac_sha256(chaining_key, ikm)
    out1 = hmac_sha256(temp, b"\x01")
    out2 = hmac_sha256(temp, out1 + b"\x02")
    if outputs == 2:
        return out1, out2
    return out1, out2, hmac_sha256(temp, out2 + b"\x03")


def nonce(counter: int) -> bytes:
    """AES-GCM nonce as Noise spells it: 4 zero bytes, then the counter as a big-endian u64."""
    return b"\x00\x00\x00\x00" + struct.pack(">Q", counter)


class CipherState:
    """One direction's key and nonce counter (``None`` key: pass through, as Noise says)."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key
        self.n = 0

    def encrypt(self, ad: bytes, plaintext: bytes) -> bytes:
        if self.key is None:
            return plaintext
        if self.n >= MAX_NONCE:
            raise NoiseError("nonce exhausted")
        sealed = AESGCM(self.key).encrypt(nonce(self.n), plaintext, ad)
        self.n += 1
        return sealed

    def decrypt(self, ad: bytes, ciphertext: bytes) -> bytes:
        if self.key is None:
            return ciphertext
        if self.n >= MAX_NONCE:
            raise NoiseError("nonce exhausted")
        try:
            opened = AESGCM(self.key).decrypt(nonce(self.n), ciphertext, ad)
        except InvalidTag as exc:
            raise NoiseError("a record did not decrypt") from exc
        self.n += 1
        return opened


class SymmetricState:
    """Noise's SymmetricState over SHA-256 and AES-256-GCM."""

    def __init__(self, protocol_name: bytes = PROTOCOL_NAME) -> None:
        if len(protocol_name) <= HASH_LEN:
            self.h = protocol_name.ljust(HASH_LEN, b"\x00")
        else:
            self.h = hashlib.sha256(protocol_name).digest()
        self.ck = self.h
        self.cipher = CipherState()

    def mix_hash(self, data: bytes) -> None:
        self.h = hashlib.sha256(self.h + data).digest()

    def mix_key(self, ikm: bytes) -> None:
        self.ck, key = hkdf(self.ck, ikm, 2)
        self.cipher = CipherState(key)

    def mix_key_and_hash(self, ikm: bytes) -> None:
        self.ck, temp_h, key = hkdf(self.ck, ikm, 3)
        self.mix_hash(temp_h)
        self.cipher = CipherState(key)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        ciphertext = self.cipher.encrypt(self.h, plaintext)
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        plaintext = self.cipher.decrypt(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return plaintext

    def split(self) -> tuple[CipherState, CipherState]:
        k1, k2 = hkdf(self.ck, b"", 2)
        return CipherState(k1), CipherState(k2)


def prologue(environment_id: str, executor_registration_id: str, stream_id: str) -> bytes:
    """The label and the stream's identity, each after its length as a big-endian u64."""
    parts = [PROLOGUE_LABEL, environment_id.encode(), executor_registration_id.encode(), stream_id.encode()]
    return b"".join(struct.pack(">Q", len(part)) + part for part in parts)


@dataclass(frozen=True)
class HybridPublicKey:
    """An X25519 and an ML-KEM-768 public key, raw bytes (what registration carries in base64)."""

    x25519: bytes
    mlkem768: bytes

    def __post_init__(self) -> None:
        if len(self.x25519) != DH_LEN or len(self.mlkem768) != KEM_PUBLIC_LEN:
            raise NoiseError("a hybrid public key needs 32 X25519 bytes and 1184 ML-KEM-768 bytes")


class HybridKeyPair:
    """A static (or ephemeral) X25519 + ML-KEM-768 key pair."""

    def __init__(self) -> None:
        self.dh = X25519PrivateKey.generate()
        self.kem = MLKEM768PrivateKey.generate()
        self.public = HybridPublicKey(self.dh.public_key().public_bytes_raw(), self.kem.public_key().public_bytes_raw())


@dataclass
class Transport:
    """The two cipher states after the handshake, from the harness's side."""

    send: CipherState  # k1: harness → executor
    receive: CipherState  # k2: executor → harness

    def seal(self, plaintext: bytes) -> bytes:
        return self.send.encrypt(b"", plaintext)

    def open(self, ciphertext: bytes) -> bytes:
        return self.receive.decrypt(b"", ciphertext)


class Initiator:
    """The harness's half of one stream's handshake: ``write_message1``, then ``read_message2``."""

    def __init__(
        self,
        static: HybridKeyPair,
        responder: HybridPublicKey,
        prologue_bytes: bytes,
        ephemeral: HybridKeyPair | None = None,
    ) -> None:
        self.static = static
        self.ephemeral = ephemeral or HybridKeyPair()
        self.responder = responder
        self.state = SymmetricState()
        self.state.mix_hash(prologue_bytes)
        self.state.mix_hash(responder.x25519)  # pre-message <- s
        self.state.mix_hash(responder.mlkem768)

    def write_message1(self, payload: bytes) -> bytes:
        try:
            return self._write_message1(payload)
        except ValueError as exc:  # the responder's keys do not load, or a DH result is all zero
            raise NoiseError(f"cannot write handshake message 1: {exc}") from exc

    def _write_message1(self, payload: bytes) -> bytes:
        state, rs = self.state, self.responder
        out = []
        # skem: encapsulate to the responder's static ML-KEM key.
        secret, ciphertext = MLKEM768PublicKey.from_public_bytes(rs.mlkem768).encapsulate()
        out.append(state.encrypt_and_hash(ciphertext))
        state.mix_key_and_hash(secret)
        # e: both ephemeral public keys, in the clear.
        for key in (self.ephemeral.public.x25519, self.ephemeral.public.mlkem768):
            state.mix_hash(key)
            out.append(key)
        # es
        state.mix_key(self.ephemeral.dh.exchange(X25519PublicKey.from_public_bytes(rs.x25519)))
        # s: both static public keys, encrypted.
        out.append(state.encrypt_and_hash(self.static.public.x25519))
        out.append(state.encrypt_and_hash(self.static.public.mlkem768))
        # ss
        state.mix_key(self.static.dh.exchange(X25519PublicKey.from_public_bytes(rs.x25519)))
        out.append(state.encrypt_and_hash(payload))
        return b"".join(out)

    def read_message2(self, message: bytes) -> Transport:
        """Check the executor's answer (tokens ``ekem, skem, e, ee, se``) and derive the keys."""
        if len(message) != MSG2_LEN:
            raise NoiseError(f"handshake message 2 has {len(message)} bytes, expected {MSG2_LEN}")
        state = self.state
        view = memoryview(message)
        cursor = 0

        def take(size: int) -> bytes:
            nonlocal cursor
            chunk = bytes(view[cursor : cursor + size])
            cursor += size
            return chunk

        try:
            # ekem: to our ephemeral ML-KEM key.
            ciphertext = take(KEM_CIPHERTEXT_LEN)
            state.mix_hash(ciphertext)
            state.mix_key(self.ephemeral.kem.decapsulate(ciphertext))
            # skem: to our static ML-KEM key, encrypted.
            ciphertext = state.decrypt_and_hash(take(KEM_CIPHERTEXT_LEN + TAG_LEN))
            state.mix_key_and_hash(self.static.kem.decapsulate(ciphertext))
            # e
            re_dh = take(DH_LEN)
            state.mix_hash(re_dh)
            state.mix_hash(take(KEM_PUBLIC_LEN))  # the executor's ephemeral ML-KEM key (unused after)
            re = X25519PublicKey.from_public_bytes(re_dh)
            # ee, se
            state.mix_key(self.ephemeral.dh.exchange(re))
            state.mix_key(self.static.dh.exchange(re))
            payload = state.decrypt_and_hash(take(TAG_LEN))
        except ValueError as exc:  # a malformed key or ciphertext
            raise NoiseError(f"handshake message 2 is malformed: {exc}") from exc
        if payload:
            raise NoiseError("handshake message 2 carries an unexpected payload")
        send, receive = state.split()
        return Transport(send, receive)


class Responder:
    """The executor's half, for unit tests of the initiator (and to read what 0.171.0 does)."""

    def __init__(self, static: HybridKeyPair, prologue_bytes: bytes) -> None:
        self.static = static
        self.state = SymmetricState()
        self.state.mix_hash(prologue_bytes)
        self.state.mix_hash(static.public.x25519)
        self.state.mix_hash(static.public.mlkem768)
        self.remote_static: HybridPublicKey | None = None
        self._re: HybridPublicKey | None = None

    def read_message1(self, message: bytes) -> bytes:
        state = self.state
        cursor = 0

        def take(size: int) -> bytes:
            nonlocal cursor
            chunk = message[cursor : cursor + size]
            cursor += size
            return chunk

        try:
            ciphertext = state.decrypt_and_hash(take(KEM_CIPHERTEXT_LEN))
            state.mix_key_and_hash(self.static.kem.decapsulate(ciphertext))
            re_dh, re_kem = take(DH_LEN), take(KEM_PUBLIC_LEN)
            state.mix_hash(re_dh)
            state.mix_hash(re_kem)
            self._re = HybridPublicKey(re_dh, re_kem)
            state.mix_key(self.static.dh.exchange(X25519PublicKey.from_public_bytes(re_dh)))
            rs_dh = state.decrypt_and_hash(take(DH_LEN + TAG_LEN))
            rs_kem = state.decrypt_and_hash(take(KEM_PUBLIC_LEN + TAG_LEN))
            self.remote_static = HybridPublicKey(rs_dh, rs_kem)
            state.mix_key(self.static.dh.exchange(X25519PublicKey.from_public_bytes(rs_dh)))
            return state.decrypt_and_hash(message[cursor:])
        except ValueError as exc:
            raise NoiseError(f"handshake message 1 is malformed: {exc}") from exc

    def write_message2(self) -> tuple[bytes, Transport]:
        assert self._re is not None and self.remote_static is not None, "read message 1 first"
        state = self.state
        out = []
        secret, ciphertext = MLKEM768PublicKey.from_public_bytes(self._re.mlkem768).encapsulate()
        state.mix_hash(ciphertext)
        out.append(ciphertext)
        state.mix_key(secret)
        secret, ciphertext = MLKEM768PublicKey.from_public_bytes(self.remote_static.mlkem768).encapsulate()
        out.append(state.encrypt_and_hash(ciphertext))
        state.mix_key_and_hash(secret)
        ephemeral = HybridKeyPair()
        for key in (ephemeral.public.x25519, ephemeral.public.mlkem768):
            state.mix_hash(key)
            out.append(key)
        state.mix_key(ephemeral.dh.exchange(X25519PublicKey.from_public_bytes(self._re.x25519)))
        state.mix_key(ephemeral.dh.exchange(X25519PublicKey.from_public_bytes(self.remote_static.x25519)))
        out.append(state.encrypt_and_hash(b""))
        k1, k2 = state.split()
        return b"".join(out), Transport(send=k2, receive=k1)
