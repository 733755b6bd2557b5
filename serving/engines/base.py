"""One interface for every engine, and the registry that maps a deployment's `engine` to it.

An engine turns (model, settings, address, port, key) into a process to run, says which OpenAI endpoints it serves,
and refuses models or nodes it cannot serve. Starting, health and stopping are shared (serving/engines/process.py);
an engine without a process (external) just points at a URL.

Every engine process listens on its node's advertised address (FACTORY_NODE_ADDRESS), where the gateway in the web
process reaches it, and requires its replica's own key (`Authorization: Bearer <key>`), read from a file so that it
never shows in the process list: an engine's port is useless without the gateway.
"""

from dataclasses import dataclass, field
from pathlib import Path

from accounts.registry import Registry

CHAT, COMPLETION, EMBEDDING = "chat", "completion", "embedding"


class EngineRefused(ValueError):
    """The engine cannot serve this model, or not on this node; the message says why in the user's words."""


@dataclass
class LaunchSpec:
    argv: list[str]
    # Added to the worker's environment; None removes a variable the engine must not inherit.
    env: dict[str, str | None] = field(default_factory=dict)
    health_path: str = "/v1/models"
    start_timeout_s: float = 120.0


@dataclass(frozen=True)
class Listen:
    """Where an engine process listens and the key it requires, kept in `key_file` (mode 0600)."""

    host: str
    port: int
    key_file: Path


def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class EngineAdapter:
    name: str = ""
    runs_process: bool = True
    # Answers 200 without a key while the engine is up (every engine here serves it).
    health_path: str = "/health"

    def check(self, *, model, node) -> None:
        """Raise EngineRefused when this engine cannot serve `model` on `node`."""

    def with_defaults(self, *, model, settings: dict, nodes) -> dict:
        """A new deployment's settings with what this engine fills in on `nodes` (a GPU node's defaults, say)."""
        return settings

    def check_settings(self, *, model, settings: dict, nodes) -> dict:
        """Raise EngineRefused when `settings` cannot work for `model` on `nodes`; return what they resolve to
        (defaults filled in) for the deployment's page."""
        return {}

    def capabilities(self, model) -> set[str]:
        raise NotImplementedError

    def launch_spec(self, *, model, settings: dict, served_name: str, listen: Listen, cpus: tuple[int, ...] = (),
                    cores_shared: bool = False) -> LaunchSpec:
        """`cpus`: the cores the replica is pinned to (none: not pinned); `cores_shared`: another engine of the node
        is pinned to some of them too."""
        raise NotImplementedError

    def cpu_threads(self, settings: dict) -> int:
        """The CPU threads a replica with `settings` computes on (0: it computes elsewhere, on a GPU): the
        deployment's `threads`, else the node's default for an engine (cluster/cpu_budget.py)."""
        return 0

    def threads_on(self, settings: dict, cpus: tuple[int, ...]) -> int:
        """The replica's threads on the cores it is pinned to: never more threads than cores."""
        threads = self.cpu_threads(settings)
        return min(threads, len(cpus)) if cpus else threads

    def context_length(self, *, model, settings: dict) -> int | None:
        return settings.get("context_length") or model.context_length

    def tool_strategy(self, base_url: str, api_key: str = "") -> str:
        """How the gateway serves `tools` to a replica answering at `base_url`: 'native' passes them on."""
        return "native"

    def live_stats(self, base_url: str, api_key: str = "", settings: dict | None = None) -> dict | None:
        """What a running replica at `base_url` (started with the deployment's `settings`) reports of its own load
        (slots, queue, cache), or None when the engine reports nothing."""
        return None


_engines: Registry[EngineAdapter] = Registry()


def register_engine(adapter_class: type[EngineAdapter]) -> type[EngineAdapter]:
    _engines.add(adapter_class.name, adapter_class())
    return adapter_class


def engine(name: str) -> EngineAdapter:
    """The adapter of engine `name`; each adapter module registers itself as the serving app loads."""
    return _engines[name]
