"""The one secrets module (DESIGN.md §5, "Egress and secrets"): credentials the platform must send on a user's behalf
(an external model's API key; tool secrets as Work Bridge grows) are encrypted at rest with Fernet (AES-128-CBC with
an HMAC-SHA256, from `cryptography`).

The keys come from FACTORY_SECRETS_KEY: Fernet keys separated by commas, the first encrypting and all decrypting,
so a key is rotated by putting the new one first and running `manage.py rotate_secrets`. Without it, a key is made
once in the data directory (readable by its owner only), so that a fresh `make run` encrypts from the start.
"""

import base64
import logging
import os
import re
from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import quote, quote_plus

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import models
from django.utils.translation import gettext

from accounts.atomic_files import made_once

# Stored values carry this prefix, so that a value written before encryption reads back as the text it is.
PREFIX = "fernet:"
logger = logging.getLogger(__name__)


class SecretUnreadable(Exception):
    """A stored secret that no configured key decrypts: the key was changed without rotating."""


class UnreadableSecret(str):
    """What an encrypted column reads as when no configured key decrypts it, so that one such row never stops the
    rest of the platform from loading its table: empty, so it is never sent anywhere, and holding the stored value,
    so that saving the row keeps it for the day the key it was written with is put back. Callers that need the
    secret check `unreadable()` and say which secret, and what to do."""

    stored: str

    def __new__(cls, stored: str):
        value = super().__new__(cls, "")
        value.stored = stored
        return value


def unreadable(value) -> bool:
    return isinstance(value, UnreadableSecret)


def generated_key() -> bytes:
    """The installation's own key, made once in the data dir when FACTORY_SECRETS_KEY is not set (bootstrap makes it
    before any worker starts; accounts/atomic_files.py keeps processes that still race from holding different keys)."""
    return made_once(settings.DATA_DIR / "secrets.key", Fernet.generate_key).strip()


@lru_cache(maxsize=1)
def _fernet() -> MultiFernet:
    configured = [key.strip() for key in os.environ.get("FACTORY_SECRETS_KEY", "").split(",") if key.strip()]
    keys = [key.encode() for key in configured] or [generated_key()]
    return MultiFernet([Fernet(key) for key in keys])


def encrypt(plain: str) -> str:
    return PREFIX + _fernet().encrypt(plain.encode()).decode() if plain else ""


def decrypt(stored: str) -> str:
    if not stored.startswith(PREFIX):
        return stored
    try:
        return _fernet().decrypt(stored[len(PREFIX):].encode()).decode()
    except InvalidToken as exc:
        raise SecretUnreadable("A stored secret cannot be decrypted with FACTORY_SECRETS_KEY; put the key it was "
                               "written with back in the list.") from exc


def rotated(stored: str) -> str:
    """The value encrypted with the first key (and a plaintext one encrypted for the first time)."""
    if not stored:
        return stored
    if not stored.startswith(PREFIX):
        return encrypt(stored)
    return PREFIX + _fernet().rotate(stored[len(PREFIX):].encode()).decode()


def mask(plain: str) -> str:
    """What a saved secret shows: enough to recognise it, never enough to use it."""
    if unreadable(plain):
        return gettext("cannot be decrypted: enter it again")
    return "" if not plain else ("•" * 8 + plain[-4:] if len(plain) > 12 else "•" * 8)


MASK = "••••••••"


def _spellings(value: str) -> set[str]:
    """The forms in which a secret sent by a tool can come back in an answer: as typed, base64 (standard and URL-safe,
    padded or not: an echoed Basic header or a JWT-ish wrapping) and URL-encoded (an echoed query string)."""
    encoded = value.encode()
    forms = {value, quote(value, safe=""), quote_plus(value), quote(value)}
    for b64 in (base64.b64encode(encoded).decode(), base64.urlsafe_b64encode(encoded).decode()):
        forms |= {b64, b64.rstrip("=")}
    return {form for form in forms if form}


def masked(output, secrets: Iterable[str]):
    """`output` (text, or JSON-shaped data) with every spelling of every secret replaced by the mask: the one masking
    function for whatever a tool's answer reaches (its invocation record, the invoke API, agent runs and their events,
    /mcp, app traces, evaluations). Any secret, however short, is masked whole: a partial mask leaks the rest."""
    forms = sorted({form for secret in secrets if secret for form in _spellings(secret)}, key=len, reverse=True)
    if not forms:
        return output
    pattern = re.compile("|".join(re.escape(form) for form in forms))

    def walk(value):
        if isinstance(value, str):
            return pattern.sub(MASK, value)
        if isinstance(value, dict):
            return {walk(key) if isinstance(key, str) else key: walk(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(item) for item in value]
        return value

    return walk(output)


class EncryptedTextField(models.TextField):
    """A text column holding a secret: encrypted when saved, decrypted when read."""

    def from_db_value(self, value, expression, connection):
        if not value:
            return value
        try:
            return decrypt(value)
        except SecretUnreadable:
            logger.warning("A %s.%s value cannot be decrypted with FACTORY_SECRETS_KEY", self.model.__name__,
                           self.name)
            return UnreadableSecret(value)

    def get_prep_value(self, value):
        if unreadable(value):
            return value.stored
        value = super().get_prep_value(value)
        return encrypt(value) if value and not value.startswith(PREFIX) else value
