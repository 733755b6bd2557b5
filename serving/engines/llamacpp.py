import sys

from serving.engines.base import CHAT, COMPLETION, EngineAdapter, EngineRefused, LaunchSpec, register_engine


# A CPU box rarely wants more; a deployment's settings can ask for the model's full context.
DEFAULT_CONTEXT = 4096


@register_engine
class LlamaCppEngine(EngineAdapter):
    """`python -m llama_cpp.server`, one process per replica. It serves one request at a time, so replicas give
    concurrency, and it streams no usage, so the gateway counts tokens with /extras/tokenize."""

    name = "llamacpp"

    def check(self, *, model, node) -> None:
        if model.kind != "gguf":
            raise EngineRefused(f"llama.cpp serves GGUF files; '{model.name}' is a {model.get_kind_display()}.")
        if model.is_embedding:
            raise EngineRefused("Serve embedding models with the 'embedding' engine.")

    def capabilities(self, model) -> set[str]:
        return {CHAT, COMPLETION} if model.supports_chat else {COMPLETION}

    def context_length(self, *, model, settings: dict) -> int:
        return settings.get("context_length") or min(model.context_length or DEFAULT_CONTEXT, DEFAULT_CONTEXT)

    def launch_spec(self, *, model, settings: dict, served_name: str, port: int) -> LaunchSpec:
        argv = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", model.path,
            "--model_alias", served_name,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--n_ctx", str(self.context_length(model=model, settings=settings)),
            "--n_threads", str(settings.get("threads") or 2),
            "--n_gpu_layers", str(settings.get("gpu_layers", 0)),
            # The default cancels a running stream whenever the next request arrives.
            "--interrupt_requests", "False",
            # Keeping logits for every position costs context x vocabulary floats (32 GiB for Gemma-3 at 32k);
            # only deployments that want logprobs pay for it.
            "--logits_all", str(bool(settings.get("logprobs"))),
        ]
        return LaunchSpec(argv=argv)
