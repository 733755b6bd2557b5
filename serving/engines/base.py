"""One interface for every engine, and the registry that maps a deployment's `engine` to it.

An engine turns (model, settings, port) into a process to run, says which OpenAI endpoints it serves, and
refuses models or nodes it cannot serve. Starting, health and stopping are shared (serving/engines/process.py);
an engine without a process (external) just points at a URL.
"""

from dataclasses import dataclass, field

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


class EngineAdapter:
    name: str = ""
    runs_process: bool = True

    def check(self, *, model, node) -> None:
        """Raise EngineRefused when this engine cannot serve `model` on `node`."""

    def check_settings(self, *, model, settings: dict, nodes) -> dict:
        """Raise EngineRefused when `settings` cannot work for `model` on `nodes`; return what they resolve to
        (defaults filled in) for the deployment's page."""
        return {}

    def capabilities(self, model) -> set[str]:
        raise NotImplementedError

    def launch_spec(self, *, model, settings: dict, served_name: str, port: int) -> LaunchSpec:
        raise NotImplementedError

    def context_length(self, *, model, settings: dict) -> int | None:
        return settings.get("context_length") or model.context_length

    def tool_strategy(self, base_url: str) -> str:
        """How the gateway serves `tools` to a replica answering at `base_url`: 'native' passes them on."""
        return "native"

    def live_stats(self, base_url: str) -> dict | None:
        """What a running replica at `base_url` reports of its own load (slots, queue, cache), or None when the
        engine reports nothing."""
        return None


_engines: dict[str, EngineAdapter] = {}


def register_engine(adapter_class: type[EngineAdapter]) -> type[EngineAdapter]:
    _engines[adapter_class.name] = adapter_class()
    return adapter_class


def engine(name: str) -> EngineAdapter:
    from serving.engines import embedding, external, llamacpp, vllm  # noqa: F401  each registers itself

    return _engines[name]
