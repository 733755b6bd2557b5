"""`vllm serve`, one process per replica, on GPU nodes: the engine for throughput there. llama-server is bound by
its one host thread on a fast GPU (it samples and schedules every slot itself, token by token: see llamacpp.py);
vLLM batches its sequences on the GPU with paged attention and keeps its scheduler off the per-token path.

vLLM is installed apart from the platform (`pip install -e .[vllm]`, or better a venv of its own, since it pins its
own torch build), so that `vllm` is on the node worker's PATH.

Settings, each optional:
    tensor_parallel_size     GPUs one replica spans (1); at most the node's GPUs
    gpu_memory_utilization   the share of each GPU's memory vLLM takes for weights and KV cache (0.85)
    context_length           the longest request, prompt and answer (--max-model-len; the model's own otherwise)
    max_num_seqs             sequences decoded together (DEFAULT_MAX_NUM_SEQS)
    dtype                    auto, bfloat16 or float16 (auto: the model's)
    gpus                     which of the node's GPUs (CUDA_VISIBLE_DEVICES), "0" or "0,1"

Health: vLLM answers GET /health with 200, without a key, once the model is loaded; its Prometheus /metrics gives
the replica's load (running and waiting requests, KV cache use).
"""

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from serving.engines.base import (
    CHAT,
    COMPLETION,
    EngineAdapter,
    EngineRefused,
    LaunchSpec,
    Listen,
    auth_headers,
    register_engine,
)

DEFAULT_GPU_MEMORY_UTILIZATION = 0.85
DEFAULT_MAX_NUM_SEQS = 256
DTYPES = ("auto", "bfloat16", "float16")
# Loading, compiling and capturing CUDA graphs for a large model takes minutes.
START_TIMEOUT_S = 900.0
STATS_TIMEOUT_S = 1.0


def _whole(value, low: int, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


@register_engine
class VllmEngine(EngineAdapter):
    name = "vllm"

    def check(self, *, model, node) -> None:
        if model.kind not in ("hf", "gguf"):
            raise EngineRefused(f"vLLM serves model directories or GGUF files, not a {model.get_kind_display()}.")
        gpus = node.devices.filter(kind="gpu").count()
        if gpus == 0:
            raise EngineRefused(f"vLLM needs a GPU, and node '{node.name}' has none.")

    def check_settings(self, *, model, settings: dict, nodes) -> dict:
        parallel = settings.get("tensor_parallel_size", 1)
        if not _whole(parallel, 1):
            raise EngineRefused(f"'tensor_parallel_size' must be a whole number of GPUs, at least 1; got {parallel!r}.")
        share = settings.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise EngineRefused(f"'gpu_memory_utilization' must be a share of the GPU's memory, above 0 and at most "
                                f"1; got {share!r}.")
        for name in ("context_length", "max_num_seqs"):
            if settings.get(name) is not None and not _whole(settings[name], 1):
                raise EngineRefused(f"'{name}' must be a whole number, at least 1; got {settings[name]!r}.")
        if model.context_length and (settings.get("context_length") or 0) > model.context_length:
            raise EngineRefused(f"A context of {settings['context_length']} tokens is beyond what '{model.name}' was "
                                f"trained for ({model.context_length}).")
        if settings.get("dtype", "auto") not in DTYPES:
            raise EngineRefused(f"'dtype' must be one of {', '.join(DTYPES)}; got {settings['dtype']!r}.")
        chosen = settings.get("gpus")
        if chosen is not None and not (isinstance(chosen, str) and re.fullmatch(r"\d+(,\d+)*", chosen)):
            raise EngineRefused(f"'gpus' must name the node's GPUs by index, like \"0\" or \"0,1\"; got {chosen!r}.")
        for node in nodes:
            indexes = set(node.devices.filter(kind="gpu").values_list("index", flat=True))
            usable = len(chosen.split(",")) if chosen else len(indexes)
            if chosen and not {int(index) for index in chosen.split(",")} <= indexes:
                raise EngineRefused(f"Node '{node.name}' has no GPU {chosen} (its GPUs: "
                                    f"{', '.join(str(i) for i in sorted(indexes)) or 'none'}).")
            if parallel > usable:
                raise EngineRefused(f"A tensor-parallel size of {parallel} needs {parallel} GPUs; node '{node.name}' "
                                    f"gives this replica {usable}.")
        return {"tensor_parallel_size": parallel, "gpu_memory_utilization": share,
                "max_num_seqs": settings.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS}

    def capabilities(self, model) -> set[str]:
        return {CHAT, COMPLETION} if model.supports_chat else {COMPLETION}

    def launch_spec(self, *, model, settings: dict, served_name: str, listen: Listen, cpus: tuple[int, ...] = (),
                    cores_shared: bool = False) -> LaunchSpec:
        argv = [
            "vllm", "serve", model.path,
            "--served-model-name", served_name,
            "--host", listen.host,
            "--port", str(listen.port),
            "--tensor-parallel-size", str(settings.get("tensor_parallel_size") or 1),
            "--gpu-memory-utilization", str(settings.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION),
            "--max-num-seqs", str(settings.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS),
        ]
        if settings.get("context_length"):
            argv += ["--max-model-len", str(settings["context_length"])]
        if settings.get("dtype"):
            argv += ["--dtype", settings["dtype"]]
        # vLLM reads its key from the environment (VLLM_API_KEY), which keeps it out of the process list.
        env = {"VLLM_API_KEY": listen.key_file.read_text().strip()}
        if settings.get("gpus"):
            env["CUDA_VISIBLE_DEVICES"] = settings["gpus"]
        return LaunchSpec(argv=argv, env=env, health_path=self.health_path, start_timeout_s=START_TIMEOUT_S)

    def live_stats(self, base_url: str, api_key: str = "", settings: dict | None = None) -> dict | None:
        """From the replica's Prometheus /metrics: running requests against the sequences it decodes at once, the
        requests waiting, and the KV cache's use of its capacity (blocks x block size, in tokens)."""
        try:
            text = httpx.get(f"{base_url.removesuffix('/v1')}/metrics", headers=auth_headers(api_key),
                             timeout=STATS_TIMEOUT_S).raise_for_status().text
        except httpx.HTTPError as exc:
            return {"error": f"The engine did not report its load: {exc.__class__.__name__}"}
        values, capacity = {}, None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removeprefix("vllm:")
                values[name] = values.get(name, 0.0) + sample.value
                if name == "cache_config_info" and sample.labels.get("num_gpu_blocks", "").isdigit():
                    capacity = int(sample.labels["num_gpu_blocks"]) * int(sample.labels.get("block_size") or 16)
        # vLLM 0.10 renamed gpu_cache_usage_perc (a share, 0-1, despite the name) to kv_cache_usage_perc.
        use = values.get("kv_cache_usage_perc", values.get("gpu_cache_usage_perc"))
        return {
            "slots_total": (settings or {}).get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS,
            "slots_busy": int(values.get("num_requests_running", 0)),
            "requests_waiting": int(values.get("num_requests_waiting", 0)),
            "kv_cache_tokens": round(use * capacity) if use is not None and capacity else None,
            "kv_cache_capacity": capacity,
            "kv_cache_use": round(use, 4) if use is not None else None,
            "prompt_tokens_total": int(values.get("prompt_tokens_total", 0)),
            "output_tokens_total": int(values.get("generation_tokens_total", 0)),
        }
