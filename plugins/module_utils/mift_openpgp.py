"""Fingerprints of the primary keys in an OpenPGP public key file (armored or binary), stdlib only.

RFC 4880 §12.2 (v4: SHA-1 over 0x99, a two-octet length and the key packet body) and RFC 9580
§5.5.4 (v6: SHA-256 over 0x9B, a four-octet length and the body; v5 of the crypto-refresh drafts
used 0x9A the same way). The result is what ``gpg --show-keys --with-colons`` prints on the ``fpr``
line of each ``pub`` key, so that nodes need no gpg.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

PUBLIC_KEY = 6
PUBLIC_SUBKEY = 14
_ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
_ARMOR_END = "-----END PGP PUBLIC KEY BLOCK-----"


class KeyFileError(ValueError):
    """The file is not an OpenPGP public key (block)."""


def dearmor(data: bytes) -> bytes:
    """The binary packets of an armored key block; binary input is returned unchanged."""
    if data[:1] and data[0] & 0x80:
        return data
    text = data.decode("ascii", errors="replace")
    if _ARMOR_BEGIN not in text:
        msg = "no OpenPGP public key block (no BEGIN PGP PUBLIC KEY BLOCK line, not binary either)"
        raise KeyFileError(msg)
    body = text.split(_ARMOR_BEGIN, 1)[1].split(_ARMOR_END, 1)[0]
    lines = [line.strip() for line in body.strip("\r\n").splitlines()]
    if "" in lines:  # armor headers (Version:, Comment:) end at the first blank line
        lines = lines[lines.index("") + 1 :]
    payload = "".join(line for line in lines if line and not line.startswith("="))
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        msg = f"the armored key block is not valid base64 ({exc})"
        raise KeyFileError(msg) from exc


def packets(raw: bytes) -> list[tuple[int, bytes]]:
    """(tag, body) of each packet, old and new header formats (RFC 4880 §4.2)."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(raw):
        head = raw[pos]
        if not head & 0x80:
            msg = f"byte {pos} is not an OpenPGP packet header"
            raise KeyFileError(msg)
        pos += 1
        if head & 0x40:  # new format
            tag = head & 0x3F
            first = _byte(raw, pos)
            if first < 192:
                length, pos = first, pos + 1
            elif first < 224:
                length, pos = ((first - 192) << 8) + _byte(raw, pos + 1) + 192, pos + 2
            elif first == 255:
                length, pos = int.from_bytes(_take(raw, pos + 1, 4), "big"), pos + 5
            else:
                msg = "partial body lengths do not occur in key packets"
                raise KeyFileError(msg)
        else:
            tag = (head >> 2) & 0x0F
            size = {0: 1, 1: 2, 2: 4}.get(head & 0x03)
            if size is None:
                msg = "indeterminate packet length"
                raise KeyFileError(msg)
            length, pos = int.from_bytes(_take(raw, pos, size), "big"), pos + size
        out.append((tag, _take(raw, pos, length)))
        pos += length
    return out


def fingerprint(body: bytes) -> str:
    """Fingerprint of one public key packet body (v4, v5 or v6), upper-case hex."""
    version = _byte(body, 0)
    if version == 4:
        return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()  # noqa: S324 - RFC 4880
    if version in (5, 6):
        prefix = b"\x9a" if version == 5 else b"\x9b"
        return hashlib.sha256(prefix + len(body).to_bytes(4, "big") + body).hexdigest().upper()
    msg = f"key packet version {version} has no fingerprint this reader knows (v4, v5, v6)"
    raise KeyFileError(msg)


def primary_fingerprints(data: bytes) -> list[str]:
    """Fingerprints of every primary key in the file (subkeys are not listed)."""
    found = [fingerprint(body) for tag, body in packets(dearmor(data)) if tag == PUBLIC_KEY]
    if not found:
        msg = "no public key packet in the file"
        raise KeyFileError(msg)
    return found


def normalise(value: str) -> str:
    """'CA8B B472 ...' or 'ca8bb472...' -> 'CA8BB472...' (gpg prints fingerprints in groups)."""
    return "".join(value.split()).upper().removeprefix("0X")


def _byte(raw: bytes, pos: int) -> int:
    if pos >= len(raw):
        msg = "the key data is cut short"
        raise KeyFileError(msg)
    return raw[pos]


def _take(raw: bytes, pos: int, size: int) -> bytes:
    if pos + size > len(raw):
        msg = "the key data is cut short"
        raise KeyFileError(msg)
    return raw[pos : pos + size]
