"""The appliance's env file, <prefix>/env: the KEY=VALUE lines every platform process reads, systemd first (each unit's
EnvironmentFile=). It is read here as systemd reads it, so the upgrader, the supervisor and the smoke test see what
the services see: the key and value are stripped, a value in matching single or double quotes loses them, and a line
that does not assign a variable name (blank, a # or ; comment, `export KEY=...`) is skipped.
"""

import re
from pathlib import Path

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
QUOTES = ("'", '"')


def read(path: Path, *, missing_ok: bool = False) -> dict[str, str]:
    """The file's assignments, in order; {} for a missing file when `missing_ok` (systemd's `EnvironmentFile=-`)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise
    env = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not NAME.fullmatch(key):
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in QUOTES:
            value = value[1:-1]
        env[key] = value
    return env
