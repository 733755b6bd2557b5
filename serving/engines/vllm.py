from serving.engines.base import CHAT, COMPLETION, EngineAdapter, EngineRefused, LaunchSpec, Listen, register_engine


@register_engine
class VllmEngine(EngineAdapter):
    """`vllm serve`, one process per replica, GPU nodes only (`pip install -e .[vllm]` there)."""

    name = "vllm"

    def check(self, *, model, node) -> None:
        if model.kind not in ("hf", "gguf"):
            raise EngineRefused(f"vLLM serves model directories or GGUF files, not a {model.get_kind_display()}.")
        gpus = node.devices.filter(kind="gpu").count()
        if gpus == 0:
            raise EngineRefused(f"vLLM needs a GPU, and node '{node.name}' has none.")

    def capabilities(self, model) -> set[str]:
        return {CHAT, COMPLETION} if model.supports_chat else {COMPLETION}

    def launch_spec(self, *, model, settings: dict, served_name: str, listen: Listen,
                    spare_cores: int | None = None) -> LaunchSpec:
        argv = [
            "vllm", "serve", model.path,
            "--served-model-name", served_name,
            "--host", listen.host,
            "--port", str(listen.port),
            "--tensor-parallel-size", str(settings.get("tensor_parallel_size") or 1),
            "--gpu-memory-utilization", str(settings.get("gpu_memory_utilization") or 0.85),
        ]
        if settings.get("context_length"):
            argv += ["--max-model-len", str(settings["context_length"])]
        # vLLM reads its key from the environment (VLLM_API_KEY), which keeps it out of the process list.
        env = {"VLLM_API_KEY": listen.key_file.read_text().strip()}
        if settings.get("gpus"):
            env["CUDA_VISIBLE_DEVICES"] = settings["gpus"]
        return LaunchSpec(argv=argv, env=env, health_path="/health", start_timeout_s=900.0)
