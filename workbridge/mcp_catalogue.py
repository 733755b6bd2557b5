"""The operator's catalogue of local MCP commands: the only programs a workspace can have the platform start.

A stdio MCP server is a command run on the platform's machine. A workspace (whose admin can be anyone who made it)
therefore never types one: it picks an entry the operator installed in FACTORY_MCP_COMMANDS (a TOML file, by default
`<data dir>/mcp-commands.toml`), and may add only the arguments the entry allows:

    [time]
    description = "The time in any time zone (the reference mcp-server-time)"
    command = ["/opt/ai-factory/venv/bin/mcp-server-time"]
    arguments = ["--local-timezone=[A-Za-z_]+(/[A-Za-z_]+)*"]   # each extra argument must match one whole
    env = { TZ = "Asia/Shanghai" }

    [git]
    command = ["/usr/local/bin/mcp-server-git", "--repository", "/srv/repos/handbook"]
    read_only_paths = ["/srv/repos/handbook"]   # what the sandbox shows it of the machine, read-only

Every entry runs inside the same bubblewrap sandbox as python tools (no network, no view of the platform's files, as
an unprivileged user), unless it says `sandbox = false` with a `reason`, which the GUI shows. A platform
administrator in a signed-in session may still register a free-form command for a workspace; it is sandboxed too.
"""

import os
import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings


class CatalogueRefused(ValueError):
    """The catalogue, or a use of it, is not acceptable; the message says why, for the user."""


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    command: tuple[str, ...]
    description: str = ""
    # Patterns (Python regular expressions) that each extra argument a workspace adds must match whole.
    arguments: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    sandbox: bool = True
    reason: str = ""
    read_only_paths: tuple[str, ...] = ()

    def executable(self) -> str | None:
        """The command's program as found on this machine, or None when it is not there."""
        program = self.command[0]
        if os.sep in program:
            return program if os.access(program, os.X_OK) and Path(program).is_file() else None
        return shutil.which(program)

    def argv(self, extra: list[str]) -> list[str]:
        """The command line for a workspace's extra arguments, each checked against the entry's patterns. No shell
        ever reads it, so `; rm` or `$(…)` would only be odd arguments; they are refused all the same, as is any
        argument (a `--config=/etc/…`) that the operator did not foresee."""
        for argument in extra:
            if not isinstance(argument, str) or "\x00" in argument or not any(
                    re.fullmatch(pattern, argument) for pattern in self.arguments):
                allowed = ", ".join(self.arguments) or "none"
                raise CatalogueRefused(f"The argument {argument!r} is not one that the catalogue entry '{self.name}' "
                                       f"allows (allowed patterns: {allowed}).")
        return [*self.command, *extra]


def _entry(name: str, table) -> CatalogueEntry:
    where = f"{settings.MCP_COMMANDS_FILE} [{name}]"
    if not isinstance(table, dict):
        raise CatalogueRefused(f"{where} must be a table.")
    command = table.get("command")
    if not (isinstance(command, list) and command and all(isinstance(part, str) and part for part in command)):
        raise CatalogueRefused(f"{where}: 'command' must be a list of words, the program first.")
    patterns = table.get("arguments", [])
    env = table.get("env", {})
    paths = table.get("read_only_paths", [])
    sandbox = table.get("sandbox", True)
    if not (isinstance(patterns, list) and all(isinstance(p, str) for p in patterns)):
        raise CatalogueRefused(f"{where}: 'arguments' must be a list of patterns.")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise CatalogueRefused(f"{where}: the argument pattern {pattern!r} is not a regular expression: {exc}")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise CatalogueRefused(f"{where}: 'env' must map names to strings.")
    if not (isinstance(paths, list) and all(isinstance(p, str) and os.path.isabs(p) for p in paths)):
        raise CatalogueRefused(f"{where}: 'read_only_paths' must be a list of absolute paths.")
    if not isinstance(sandbox, bool):
        raise CatalogueRefused(f"{where}: 'sandbox' is true or false.")
    reason = str(table.get("reason", "")).strip()
    if not sandbox and not reason:
        raise CatalogueRefused(f"{where}: an entry that runs outside the sandbox must give its 'reason'.")
    return CatalogueEntry(name=name, command=tuple(command), description=str(table.get("description", "")),
                          arguments=tuple(patterns), env=dict(env), sandbox=sandbox, reason=reason,
                          read_only_paths=tuple(paths))


_cache: tuple[tuple, dict[str, CatalogueEntry]] | None = None


def entries() -> dict[str, CatalogueEntry]:
    """The catalogue as the file says now (read again whenever it changes); none when there is no file."""
    global _cache
    path = Path(settings.MCP_COMMANDS_FILE)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if _cache is None or _cache[0] != key:
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise CatalogueRefused(f"The MCP command catalogue {path} cannot be read: {exc}") from exc
        _cache = key, {name: _entry(name, table) for name, table in document.items()}
    return _cache[1]


def entry(name: str) -> CatalogueEntry:
    found = entries().get(name)
    if found is None:
        offered = ", ".join(sorted(entries())) or "none"
        raise CatalogueRefused(f"The operator's MCP command catalogue has no entry '{name}' (it has: {offered}). "
                               f"Local commands are added by the operator in {settings.MCP_COMMANDS_FILE}.")
    return found
