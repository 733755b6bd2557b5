"""llama.cpp's own C++ server, `llama-server`, one process per replica: parallel slots with continuous batching,
chat templates through Jinja, JSON-schema response formats, usage in the stream, and a Prometheus `/metrics`.

The binary is built once from the llama.cpp source that the pinned llama-cpp-python sdist vendors
(scripts/build-llama.sh) and linked into the venv's bin/ by setup.

Each slot holds its own context: a request may use up to `context_length` tokens (prompt and answer), and the
engine's KV cache is `parallel` x `context_length` tokens. Requests beyond `parallel` wait in the engine's queue.

On a GPU node (its GPUs registered in the pool, its llama-server built with CUDA by scripts/build-llama.sh) a new
deployment starts from GPU_DEFAULTS unless its settings name their own: every layer and the KV cache on the GPUs,
flash attention where the CUDA backend has it, and up to 32 slots, as many as a KV budget of GPU_KV_BUDGET_TOKENS
and the GPUs' memory allow. Past that, llama-server is bound by its host thread (one thread samples and schedules
every slot, token by token), so a small model gains little from a faster GPU: vLLM (serving/engines/vllm.py) is
the engine for throughput on GPUs. `backend_sampling` (llama.cpp's experimental sampling on the GPU) takes the
sampling off that thread, for a deployment that tries it.
"""

import hashlib
import shutil
import sys
from pathlib import Path

import httpx
from django.conf import settings as django_settings
from prometheus_client.parser import text_string_to_metric_families

from accounts.atomic_files import made_once
from cluster import cpu_budget
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
from serving.gguf_info import InvalidModelFile, read_gguf

# A CPU box rarely wants more per request; a deployment's settings can ask for the model's full context.
DEFAULT_CONTEXT = 4096
# Slots beyond about two per core add queueing inside the engine rather than throughput (bench/engine_concurrency).
SLOTS_PER_THREAD = 2
# A replica given one core still takes four streams at once: a fifth person's first token would otherwise wait for
# a whole answer, where batching them costs each stream little on a small model.
MIN_SLOT_THREADS = 2
MAX_DEFAULT_SLOTS = 8
MAX_SLOTS = 64
# The default slot count never sizes a KV cache past this many tokens in all.
DEFAULT_KV_BUDGET_TOKENS = 32768
# A page load waits for the replicas' answers this long at most.
STATS_TIMEOUT_S = 1.0
# What a deployment's KV cache may take of its node's memory, next to the weights.
MAX_MEMORY_SHARE = 0.8
# llama-server keeps finished prompts' KV in host memory for reuse, up to 8 GiB a replica by default: a 30-minute soak
# saw SmolLM2's replica grow 958 -> 1,582 MiB and still growing. A deployment's `prompt_cache_mib` bounds it (0: off).
DEFAULT_PROMPT_CACHE_MIB = 256
INTEGER_SETTINGS = {"context_length": (16, None), "parallel": (1, MAX_SLOTS), "threads": (1, 512),
                    "batch_size": (1, 65536), "ubatch_size": (1, 65536), "gpu_layers": (0, 10000),
                    "prompt_cache_mib": (0, 1048576)}
FLASH_ATTENTION = ("on", "off", "auto")
# More layers than any model has: llama-server puts all of them, and the KV cache, on the GPUs.
FULL_OFFLOAD = 999
# A new deployment's settings on nodes that all have GPUs and a CUDA llama-server (the slots follow from the GPUs'
# memory, see slots()). batch and ubatch are llama.cpp's own defaults, written out so the deployment shows them:
# prompts are taken 2,048 tokens at a time, in GPU passes of 512.
GPU_DEFAULTS = {"gpu_layers": FULL_OFFLOAD, "flash_attn": "auto", "batch_size": 2048, "ubatch_size": 512}
GPU_MAX_DEFAULT_SLOTS = 32
GPU_KV_BUDGET_TOKENS = 131072
# What a deployment's weights and KV cache may take of its node's GPU memory (the CUDA context and compute buffers
# take the rest).
MAX_GPU_MEMORY_SHARE = 0.9


def gpu_memory_bytes(node) -> int:
    """The GPU memory of a node whose llama-server can use it (its build has CUDA); 0 for a CPU node."""
    if not (node.info or {}).get("llama_cuda"):
        return 0
    return sum(device.memory_bytes for device in node.devices.all() if device.kind == "gpu")


def offloads(settings: dict) -> bool:
    return bool(settings.get("gpu_layers"))


def server_binary() -> str:
    """llama-server beside this interpreter (setup links it into the venv), else on PATH."""
    beside = Path(sys.executable).parent / "llama-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("llama-server")
    if found is None:
        raise EngineRefused("llama-server is not installed on this node; run `make install` (scripts/install.sh) "
                            "there, which builds it once.")
    return found


def _chat_template_file(template: str) -> Path:
    """The template as a file named by its checksum, so that replicas of one model share it and an edit makes a
    new file rather than changing one a running replica reads."""
    digest = hashlib.sha256(template.encode()).hexdigest()[:16]
    path = Path(django_settings.DATA_DIR) / "chat-templates" / f"{digest}.jinja"
    made_once(path, template.encode, mode=0o644)
    return path


@register_engine
class LlamaCppEngine(EngineAdapter):
    name = "llamacpp"

    def check(self, *, model, node) -> None:
        if model.kind != "gguf":
            raise EngineRefused(f"llama.cpp serves GGUF files; '{model.name}' is a {model.get_kind_display()}.")
        if model.is_embedding:
            raise EngineRefused("Serve embedding models with the 'embedding' engine.")

    def with_defaults(self, *, model, settings: dict, nodes) -> dict:
        """On nodes that all run llama.cpp on GPUs: GPU_DEFAULTS under `settings`, and the slots that fit (kept
        with the deployment, so every start uses them). Elsewhere `settings` as they are."""
        if not nodes or not all(gpu_memory_bytes(node) for node in nodes):
            return settings
        settings = {**GPU_DEFAULTS, **settings}
        if offloads(settings) and not settings.get("parallel"):
            try:
                per_token = read_gguf(Path(model.path)).kv_bytes_per_token
            except InvalidModelFile:
                return settings  # check_settings refuses it with the reason
            settings["parallel"] = self.slots(model=model, settings=settings, nodes=nodes,
                                              kv_bytes_per_token=per_token)
        return settings

    def check_settings(self, *, model, settings: dict, nodes) -> dict:
        for name, (low, high) in INTEGER_SETTINGS.items():
            value = settings.get(name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low or (high and value > high):
                bounds = f"from {low} to {high}" if high else f"at least {low}"
                raise EngineRefused(f"'{name}' must be a whole number {bounds}; got {value!r}.")
        if settings.get("flash_attn") is not None and settings["flash_attn"] not in FLASH_ATTENTION:
            raise EngineRefused(f"'flash_attn' must be one of {', '.join(FLASH_ATTENTION)}; "
                                f"got {settings['flash_attn']!r}.")
        if not isinstance(settings.get("backend_sampling", False), bool):
            raise EngineRefused("'backend_sampling' must be true or false.")
        if settings.get("draft_model_id") is not None:
            self._draft(model, settings)
        context = self.context_length(model=model, settings=settings)
        if model.context_length and context > model.context_length:
            raise EngineRefused(f"A context of {context} tokens is beyond what '{model.name}' was trained for "
                                f"({model.context_length}).")
        try:
            per_token = read_gguf(Path(model.path)).kv_bytes_per_token
        except InvalidModelFile as exc:
            raise EngineRefused(str(exc))
        slots = self.slots(model=model, settings=settings, nodes=nodes, kv_bytes_per_token=per_token)
        kv_bytes = per_token * context * slots
        for node in nodes:
            gpu = gpu_memory_bytes(node) if offloads(settings) else 0
            memory, share, where = (gpu, MAX_GPU_MEMORY_SHARE, "GPU memory") if gpu else (
                node.memory_bytes, MAX_MEMORY_SHARE, "memory")
            room = memory * share - (model.size_bytes or 0)
            if memory and kv_bytes > room:
                raise EngineRefused(
                    f"{slots} slots of {context} tokens need a {kv_bytes / 2**30:.1f} GiB KV cache, more than node "
                    f"'{node.name}' can hold next to the model ({max(room, 0) / 2**30:.1f} GiB of {where} free "
                    f"for it); lower 'parallel' or 'context_length'.")
        return {"parallel": slots, "context_length": context, "kv_cache_bytes": kv_bytes}

    def _draft(self, model, settings: dict):
        """The draft model a speculative deployment decodes with, if its vocabulary matches the big model's; a
        draft that does not is refused here, since llama-server would only log it and serve without."""
        from serving.groups.vocabulary import draft_incompatibility
        from serving.models import Model, ModelKind

        draft = Model.objects.filter(pk=settings["draft_model_id"]).first() \
            if isinstance(settings["draft_model_id"], int) else None
        if draft is None or draft.kind != ModelKind.GGUF or draft.is_embedding:
            raise EngineRefused("'draft_model_id' must name a registered GGUF text model.")
        try:
            problem = draft_incompatibility(model.path, draft.path)
        except (OSError, ValueError) as exc:  # a file gone or unreadable since it was registered
            raise EngineRefused(f"The vocabularies of '{model.name}' and '{draft.name}' could not be read: {exc}")
        if problem:
            raise EngineRefused(f"'{draft.name}' cannot draft for '{model.name}' in llama-server: {problem}.")
        return draft

    def capabilities(self, model) -> set[str]:
        return {CHAT, COMPLETION} if model.supports_chat else {COMPLETION}

    def context_length(self, *, model, settings: dict) -> int:
        return settings.get("context_length") or min(model.context_length or DEFAULT_CONTEXT, DEFAULT_CONTEXT)

    def slots(self, *, model, settings: dict, nodes=(), kv_bytes_per_token: int = 0) -> int:
        """The deployment's `parallel`, else: offloaded to the GPUs of `nodes`, up to GPU_MAX_DEFAULT_SLOTS within
        a KV budget of GPU_KV_BUDGET_TOKENS and what the smallest node's GPUs hold next to the model; on CPUs,
        about two slots a thread (bench/engine_concurrency)."""
        if settings.get("parallel"):
            return settings["parallel"]
        context = self.context_length(model=model, settings=settings)
        rooms = [gpu_memory_bytes(node) * MAX_GPU_MEMORY_SHARE - (model.size_bytes or 0)
                 for node in nodes] if offloads(settings) else []
        if rooms and all(room > 0 for room in rooms):
            slots = min(GPU_MAX_DEFAULT_SLOTS, GPU_KV_BUDGET_TOKENS // context)
            if kv_bytes_per_token:
                slots = min(slots, int(min(rooms) // (kv_bytes_per_token * context)))
            return max(1, slots)
        by_threads = SLOTS_PER_THREAD * max(self.cpu_threads(settings), MIN_SLOT_THREADS)
        by_memory = DEFAULT_KV_BUDGET_TOKENS // context
        return max(1, min(by_threads, by_memory, MAX_DEFAULT_SLOTS))

    def launch_spec(self, *, model, settings: dict, served_name: str, listen: Listen, cpus: tuple[int, ...] = (),
                    cores_shared: bool = False) -> LaunchSpec:
        context, slots = self.context_length(model=model, settings=settings), self.slots(model=model, settings=settings)
        threads = self.threads_on(settings, cpus)
        argv = [
            server_binary(),
            "--model", model.path,
            "--alias", served_name,
            "--host", listen.host,
            "--port", str(listen.port),
            # Every route but /health needs the replica's key, which only the gateway and its node's worker hold.
            "--api-key-file", str(listen.key_file),
            # The whole KV cache, split evenly: every slot holds a full context of its own.
            "--ctx-size", str(context * slots),
            "--parallel", str(slots),
            "--no-kv-unified",
            "--threads", str(threads),
            "--threads-http", str(max(4, slots)),
            "--n-gpu-layers", str(settings.get("gpu_layers", 0)),
            "--cache-ram", str(settings.get("prompt_cache_mib", DEFAULT_PROMPT_CACHE_MIB)),
            "--jinja",
            "--metrics",
            # The platform's GUI is the only front end, and nothing is ever downloaded.
            "--no-webui",
            "--offline",
        ]
        if settings.get("flash_attn"):
            argv += ["--flash-attn", settings["flash_attn"]]
        if settings.get("backend_sampling"):
            argv += ["--backend-sampling"]
        if settings.get("batch_size"):
            argv += ["--batch-size", str(settings["batch_size"])]
        if settings.get("ubatch_size"):
            argv += ["--ubatch-size", str(settings["ubatch_size"])]
        if model.chat_template:
            argv += ["--chat-template-file", str(_chat_template_file(model.chat_template))]
        if settings.get("draft_model_id") is not None:
            # Speculative decoding: llama-server uses a draft model only with the type named.
            argv += ["--model-draft", self._draft(model, settings).path, "--spec-type", "draft-simple"]
        return LaunchSpec(argv=argv, env=self._wait_policy(cores_shared), health_path="/health",
                          start_timeout_s=180.0)

    def cpu_threads(self, settings: dict) -> int:
        return settings.get("threads") or cpu_budget.budget().engine_threads

    @staticmethod
    def _wait_policy(cores_shared: bool) -> dict[str, str | None]:
        """The platform's processes make OpenMP threads sleep when idle (factory/settings.py). A replica whose
        threads have cores to themselves must not: its decode threads idle between every token, and waking them
        made SmolLM2's TPOT 1.5-2.5x slower on 2 cores (17 ms against 11 ms). OpenMP's default, a short spin, is
        fastest there. But two spinning replicas sharing cores spin against each other's descheduled threads in
        ggml's barriers: 4 concurrent streams of 48 tokens over two such replicas on 2 cores took 137 s, against
        1.9 s when they sleep and 2.5 s when only the first spins."""
        if cores_shared:
            return {}
        return {"OMP_WAIT_POLICY": None}

    def tool_strategy(self, base_url: str, api_key: str = "") -> str:
        """'native' when the chat template has a tool-call format llama-server parses; otherwise llama-server drops
        `tools`, so the gateway constrains the reply instead."""
        try:
            props = httpx.get(f"{base_url.removesuffix('/v1')}/props", headers=auth_headers(api_key),
                              timeout=STATS_TIMEOUT_S * 5)
            caps = props.raise_for_status().json().get("chat_template_caps") or {}
        except (httpx.HTTPError, ValueError):
            caps = {}
        return "native" if caps.get("supports_tool_calls") else "constrained"

    def live_stats(self, base_url: str, api_key: str = "", settings: dict | None = None) -> dict | None:
        """From the replica's Prometheus /metrics and /slots: busy and total slots, the requests waiting for one,
        the KV cache the slots hold, and the engine's own token counters and speeds."""
        root, headers = base_url.removesuffix("/v1"), auth_headers(api_key)
        try:
            metrics_text = httpx.get(f"{root}/metrics", headers=headers,
                                     timeout=STATS_TIMEOUT_S).raise_for_status().text
            slots = httpx.get(f"{root}/slots", headers=headers, timeout=STATS_TIMEOUT_S).raise_for_status().json()
        except (httpx.HTTPError, ValueError) as exc:
            return {"error": f"The engine did not report its load: {exc.__class__.__name__}"}
        values = {sample.name.removeprefix("llamacpp:"): sample.value
                  for family in text_string_to_metric_families(metrics_text) for sample in family.samples}
        capacity = sum(slot.get("n_ctx", 0) for slot in slots)
        held = sum(slot.get("n_prompt_tokens", 0) + sum(t.get("n_decoded", 0) for t in slot.get("next_token", []))
                   for slot in slots if slot.get("is_processing"))
        return {
            "slots_total": len(slots),
            "slots_busy": sum(1 for slot in slots if slot.get("is_processing")),
            "requests_waiting": int(values.get("requests_deferred", 0)),
            "kv_cache_tokens": held,
            "kv_cache_capacity": capacity,
            "kv_cache_use": round(held / capacity, 4) if capacity else None,
            "prompt_tokens_total": int(values.get("prompt_tokens_total", 0)),
            "output_tokens_total": int(values.get("tokens_predicted_total", 0)),
            "prompt_tokens_per_s": values.get("prompt_tokens_seconds"),
            "output_tokens_per_s": values.get("predicted_tokens_seconds"),
        }
