import sys

from cluster import cpu_budget
from serving.engines.base import EMBEDDING, EngineAdapter, EngineRefused, LaunchSpec, Listen, register_engine


@register_engine
class EmbeddingEngine(EngineAdapter):
    """serving/engines/embedding_server.py: sentence-transformers behind /v1/embeddings, batching concurrent
    requests, so no embedding model ever loads in the web process."""

    name = "embedding"

    def check(self, *, model, node) -> None:
        if model.kind != "hf" or not model.is_embedding:
            raise EngineRefused("The embedding engine serves sentence-transformers model directories "
                                "registered with the embedding role.")

    def capabilities(self, model) -> set[str]:
        return {EMBEDDING}

    def launch_spec(self, *, model, settings: dict, served_name: str, listen: Listen, cpus: tuple[int, ...] = (),
                    cores_shared: bool = False) -> LaunchSpec:
        argv = [
            sys.executable, "-m", "serving.engines.embedding_server",
            "--model", model.path,
            "--served-model-name", served_name,
            "--host", listen.host,
            "--port", str(listen.port),
            "--api-key-file", str(listen.key_file),
            "--threads", str(self.threads_on(settings, cpus)),
            "--max-batch-size", str(settings.get("max_batch_size") or 64),
        ]
        return LaunchSpec(argv=argv, health_path="/health")

    def cpu_threads(self, settings: dict) -> int:
        return settings.get("threads") or cpu_budget.budget().engine_threads
