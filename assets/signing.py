"""The instance's Ed25519 signing key, and the keys whose bundles this instance accepts.

The private key is made on first use and kept in DATA_DIR/instance_key.pem (mode 0600), so every process of the
instance (web, workers) signs with the same key. Bundles are accepted when signed by this key or by one of the
public keys in FACTORY_TRUSTED_BUNDLE_KEYS (base64, as the Assets page shows them).
"""

import base64
import binascii
import hashlib
import threading
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from accounts.atomic_files import made_once

KEY_FILENAME = "instance_key.pem"
PUBLIC_KEY_BYTES = 32

_loaded: dict[Path, Ed25519PrivateKey] = {}
_loading = threading.Lock()


def instance_key() -> Ed25519PrivateKey:
    path = settings.DATA_DIR / KEY_FILENAME
    with _loading:
        if path not in _loaded:
            key = serialization.load_pem_private_key(made_once(path, _new_key_pem), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ImproperlyConfigured(f"{path} does not hold an Ed25519 private key.")
            _loaded[path] = key
        return _loaded[path]


def _new_key_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption())


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def instance_public_key() -> str:
    """The instance's public key, base64: what another instance adds to FACTORY_TRUSTED_BUNDLE_KEYS."""
    return base64.b64encode(_raw(instance_key().public_key())).decode()


def fingerprint(raw_public_key: bytes) -> str:
    """A short name for a public key: the first 64 bits of its sha256, as 4 groups of hex digits."""
    digest = hashlib.sha256(raw_public_key).hexdigest()[:16]
    return ":".join(digest[i:i + 4] for i in range(0, 16, 4))


def instance_fingerprint() -> str:
    return fingerprint(_raw(instance_key().public_key()))


def decode_public_key(text) -> bytes | None:
    """The raw 32 bytes of a base64 Ed25519 public key, or None when `text` is not one."""
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == PUBLIC_KEY_BYTES else None


def _trusted() -> dict[bytes, Ed25519PublicKey]:
    keys = {_raw(instance_key().public_key()): instance_key().public_key()}
    for text in settings.TRUSTED_BUNDLE_KEYS:
        raw = decode_public_key(text)
        if raw is None:
            raise ImproperlyConfigured(f"FACTORY_TRUSTED_BUNDLE_KEYS: {text!r} is not a base64 Ed25519 public key.")
        keys[raw] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def trusted_key(raw_public_key: bytes) -> Ed25519PublicKey | None:
    return _trusted().get(raw_public_key)


def sign(data: bytes) -> bytes:
    return instance_key().sign(data)


def signature_matches(public_key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    try:
        public_key.verify(signature, data)
    except InvalidSignature:
        return False
    return True
