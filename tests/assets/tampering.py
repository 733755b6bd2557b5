"""What an attacker (or a broken disk) does to a bundle: rewrite its zip with members changed, added or removed,
and optionally re-sign the manifest with some key."""

import base64
import io
import json
import zipfile

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def pack(contents: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, content in contents.items():
            archive.writestr(name, content)
    return out.getvalue()


def manifest_of(data: bytes) -> dict:
    return json.loads(members(data)["manifest.json"])


def flip_byte(content: bytes, at: int = 100) -> bytes:
    return content[:at] + bytes([content[at] ^ 0x01]) + content[at + 1:]


def public_key_text(key: Ed25519PrivateKey) -> str:
    return base64.b64encode(key.public_key().public_bytes(serialization.Encoding.Raw,
                                                          serialization.PublicFormat.Raw)).decode()


def signed(contents: dict[str, bytes], manifest: dict, key: Ed25519PrivateKey) -> bytes:
    """The bundle with `manifest` as its manifest, properly signed by `key` (which it names as the signer)."""
    manifest = {**manifest, "instance_key": public_key_text(key)}
    manifest_bytes = json.dumps(manifest).encode()
    return pack({**contents, "manifest.json": manifest_bytes,
                 "signature": base64.b64encode(key.sign(manifest_bytes))})
