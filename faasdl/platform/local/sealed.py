"""Action parameters encrypted at rest, as OpenWhisk's parameter storage encrypts them
(``ParameterEncryption.scala``, ``whisk.parameter-storage.key``: the base64 of a 16-byte key).

A value is sealed with AES-128-GCM: the record holds the base64 of the IV's length (4 bytes,
big-endian), the IV (12 random bytes) and the ciphertext with its 16-byte tag, and marks it
``"encryption": "aes128"``; the platform opens it as it starts a container or runs an
activation. OpenWhisk reads each value it seals as a string, and so does this.
"""

from __future__ import annotations

import base64
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: The ``encryption`` OpenWhisk writes beside a value it sealed with a 16-byte key.
ENCRYPTION = "aes128"
IV_BYTES = 12
_IV_LENGTH = struct.Struct(">i")


class Seal:
    """Seals and opens parameter values under one key."""

    def __init__(self, key: bytes) -> None:
        self._aes = AESGCM(key)

    def seal(self, value: str) -> str:
        iv = os.urandom(IV_BYTES)
        sealed = _IV_LENGTH.pack(IV_BYTES) + iv + self._aes.encrypt(iv, value.encode(), None)
        return base64.b64encode(sealed).decode("ascii")

    def open(self, sealed: str) -> str:
        """The value ``sealed`` holds; ``ValueError`` where it is not one this key sealed."""
        try:
            raw = base64.b64decode(sealed, validate=True)
            (length,) = _IV_LENGTH.unpack_from(raw)
            if length != IV_BYTES:
                raise ValueError(f"an IV of {length:,} bytes, not {IV_BYTES}")
            iv, text = raw[4 : 4 + IV_BYTES], raw[4 + IV_BYTES :]
            return self._aes.decrypt(iv, text, None).decode()
        except (ValueError, struct.error, InvalidTag) as exc:  # binascii's and UTF-8's too
            why = str(exc) or type(exc).__name__  # InvalidTag says nothing
            raise ValueError(f"not a value this platform's key sealed ({why})") from None
