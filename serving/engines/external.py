from serving.engines.base import CHAT, COMPLETION, EMBEDDING, EngineAdapter, EngineRefused, register_engine


@register_engine
class ExternalEngine(EngineAdapter):
    """An OpenAI-compatible endpoint run by someone else: no process, the gateway forwards to its URL."""

    name = "external"
    runs_process = False

    def check(self, *, model, node) -> None:
        if model.kind != "external" or not model.url:
            raise EngineRefused("The external engine needs a model registered by URL.")

    def capabilities(self, model) -> set[str]:
        return {EMBEDDING} if model.is_embedding else {CHAT, COMPLETION}
