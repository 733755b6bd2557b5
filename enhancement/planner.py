"""The parallelism planner: which TP × PP × DP layout, micro-batch, ZeRO stage and activation recompute a training job
should run with on a set of devices, from a memory, compute and communication cost model.

No library plans this for a mix of devices we can hand it (DeepSpeed's autotuner and Megatron's need the devices
present and run trials), so the cost model is written here, from the published formulas:

- Memory per device (bytes): weights, gradients and Adam state per parameter (16 bytes in mixed precision: 2
  weights + 2 gradients + 12 fp32 master/momentum/variance; 16 in fp32: 4+4+8), divided by TP and PP and, by ZeRO
  stage, by DP (stage 1 the optimizer state, 2 also the gradients, 3 also the weights). LoRA trains only its adapter
  matrices, so the frozen weights are the bulk and gradients and optimizer state are the adapter's.
- Activations per layer per micro-batch (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", 2022): s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes in 16-bit; with full recompute only the layer input,
  2·s·b·h. The first pipeline stage keeps min(p, m) micro-batches in flight (1F1B). Plus the logits, s·b·V·4 ·2.
- Compute: 6·N FLOPs per token for full training (2 forward, 4 backward), 4·N for LoRA (no weight gradients of the
  frozen base), plus 2·N more with recompute; attention adds 12·L·h·s per token (forward and backward together).
- Communication: Megatron TP does four all-reduces of s·b·h activations per layer per micro-batch; DP all-reduces
  the trainable gradients once per step (ZeRO-3 moves 1.5× as much); a ring all-reduce of B bytes over n takes
  2·(n−1)/n·B / bandwidth. PP sends s·b·h activations each way per micro-batch per stage boundary.
- A fixed cost per block per micro-batch pass (kernel launches, framework dispatch, the adapter's wrappers), which
  no FLOP count shows: it is why, at equal FLOPs, fewer and larger micro-batches run faster.
- The pipeline bubble: (p−1)/(m+p−1) of the step is idle. Heterogeneous devices get pipeline stages in proportion
  to their compute, so that the slowest stage sets the pace: step = (m+p−1) · max over stages of a micro-batch's
  stage time.
"""

from dataclasses import asdict, dataclass, field
from itertools import product

GIB = 1024 ** 3
# What share of a device's peak FLOPs training reaches: a common figure for GPU training; CPUs reach less of theirs.
GPU_EFFICIENCY = 0.4
CPU_EFFICIENCY = 0.3
# A CPU core's peak fp32 TFLOPS (AVX2: 2 FMA units × 8 lanes × 2 FLOPs at ~2.5 GHz), for nodes without GPUs.
CPU_CORE_TFLOPS = 0.08
# The fixed cost of one decoder block's forward and backward pass for one micro-batch. CPU: fitted with
# bench.planner on this 2-core machine (SmolLM2-135M LoRA: each extra micro-batch of its 30 blocks added 0.8 s,
# measured under a shared load); GPU: ~30 kernels of ~10 µs each.
CPU_BLOCK_PASS_S = 0.027
GPU_BLOCK_PASS_S = 0.0003
# Memory a device keeps for the framework, kernels and fragmentation, beyond what the model accounts for.
GPU_RESERVED_BYTES = 2 * GIB
CPU_RESERVED_SHARE = 0.25


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class ModelShape:
    parameters: int
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    vocab_size: int
    intermediate_size: int = 0
    head_dim: int = 0

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden_size // self.attention_heads


@dataclass(frozen=True)
class Device:
    node: str
    name: str
    memory_bytes: int
    tflops: float
    kind: str = "gpu"


@dataclass(frozen=True)
class Workload:
    method: str  # "lora" or "full"
    sequence_length: int
    global_batch: int  # samples per optimizer step
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")


@dataclass(frozen=True)
class Links:
    intra_node_gbps: float = 300.0  # GB/s between devices of one node (NVLink; memory bandwidth on a CPU)
    inter_node_gbps: float = 12.5  # GB/s between nodes (100 Gb/s Ethernet)


@dataclass
class Plan:
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    micro_batch: int
    micro_batches: int  # per step, per data-parallel rank (gradient accumulation)
    zero_stage: int
    recompute: bool
    stage_layers: list[int]
    memory_per_device_bytes: int
    memory_limit_bytes: int
    compute_s: float
    overhead_s: float
    tp_comm_s: float
    dp_comm_s: float
    pp_comm_s: float
    bubble_share: float
    step_time_s: float
    tokens_per_s: float
    nodes: int
    rank: int = 0
    why: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class PlanResult:
    plans: list[Plan]
    discarded: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"plans": [p.as_dict() for p in self.plans], "discarded": self.discarded}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def allowed_tensor_parallel(shape: ModelShape, limit: int) -> list[int]:
    """TP splits attention heads, so it must divide both the heads and the KV heads."""
    return [t for t in divisors(shape.kv_heads) if shape.attention_heads % t == 0 and t <= limit]


def lora_parameters(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    hd = shape.head_width
    widths = {"q_proj": (shape.hidden_size, shape.attention_heads * hd),
              "k_proj": (shape.hidden_size, shape.kv_heads * hd),
              "v_proj": (shape.hidden_size, shape.kv_heads * hd),
              "o_proj": (shape.attention_heads * hd, shape.hidden_size),
              "gate_proj": (shape.hidden_size, shape.intermediate_size or 4 * shape.hidden_size),
              "up_proj": (shape.hidden_size, shape.intermediate_size or 4 * shape.hidden_size),
              "down_proj": (shape.intermediate_size or 4 * shape.hidden_size, shape.hidden_size)}
    return shape.layers * sum(rank * (widths[t][0] + widths[t][1]) for t in targets if t in widths)


def stage_layers(layers: int, stage_tflops: list[float]) -> list[int]:
    """Layers per pipeline stage in proportion to each stage's compute (largest remainders), at least one each."""
    total = sum(stage_tflops)
    exact = [layers * t / total for t in stage_tflops]
    counts = [max(1, int(x)) for x in exact]
    while sum(counts) > layers:
        counts[counts.index(max(counts))] -= 1
    order = sorted(range(len(exact)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    i = 0
    while sum(counts) < layers:
        counts[order[i % len(order)]] += 1
        i += 1
    return counts


def bubble_share(pipeline: int, micro_batches: int) -> float:
    return (pipeline - 1) / (micro_batches + pipeline - 1)


def _ring_allreduce_s(size_bytes: float, ranks: int, gbps: float) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * size_bytes / (gbps * 1e9)


def memory_per_device(*, shape: ModelShape, work: Workload, tp: int, pp: int, dp: int, micro_batch: int,
                      micro_batches: int, zero: int, recompute: bool, layers_on_stage: int, gpu: bool) -> int:
    """Bytes the busiest device of the layout holds (the first stage: most activations in flight, plus embeddings
    when pp is 1 or the logits on the last)."""
    dtype = 2 if gpu else 4  # bf16 on GPUs, fp32 on CPUs
    share = layers_on_stage / shape.layers
    params_here = shape.parameters * share / tp
    # Embedding and output layers sit on the first and last stage; with pp == 1 both are here.
    embedding = shape.vocab_size * shape.hidden_size / tp
    params_here += embedding if pp == 1 else embedding / 2
    if work.method == "full":
        trainable = params_here
        weights = params_here * dtype / (dp if zero >= 3 else 1)
    else:
        trainable = lora_parameters(shape, work.lora_rank, work.lora_targets) * share / tp
        weights = params_here * dtype
    # Mixed precision keeps fp32 master weights in the optimizer state (12 bytes); fp32 training only m and v (8).
    optimizer_bytes = 12 if gpu else 8
    gradients = trainable * dtype / (dp if zero >= 2 else 1)
    optimizer = trainable * optimizer_bytes / (dp if zero >= 1 else 1)
    s, b, h, a = work.sequence_length, micro_batch, shape.hidden_size, shape.attention_heads
    scale = dtype / 2  # the published figures are for 16-bit activations
    if recompute:
        per_layer = 2 * s * b * h * scale
        working = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * scale  # one layer rebuilt at a time
    else:
        per_layer = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * scale
        working = 0
    in_flight = min(pp, micro_batches)
    activations = per_layer * layers_on_stage * in_flight + working
    logits = 2 * s * b * shape.vocab_size * 4 / tp  # fp32 logits and their gradient
    return int(weights + gradients + optimizer + activations + logits)


def _flops_per_token(shape: ModelShape, work: Workload, recompute: bool) -> float:
    n = shape.parameters
    passes = (6 if work.method == "full" else 4) + (2 if recompute else 0)
    return passes * n + 12 * shape.layers * shape.hidden_size * work.sequence_length


def plan(*, shape: ModelShape, work: Workload, devices: list[Device], links: Links = Links(),
         zero_stages: tuple[int, ...] = (0, 1, 2, 3), limit: int = 20) -> PlanResult:
    if not devices:
        raise PlanError("No devices to plan for.")
    if work.method not in ("lora", "full"):
        raise PlanError(f"Unknown method '{work.method}'; use lora or full.")
    if work.sequence_length < 1 or work.global_batch < 1:
        raise PlanError("The sequence length and the batch size must be at least 1.")
    gpu = all(d.kind == "gpu" for d in devices)
    efficiency = GPU_EFFICIENCY if gpu else CPU_EFFICIENCY
    by_node: dict[str, list[Device]] = {}
    for device in devices:
        by_node.setdefault(device.node, []).append(device)
    per_node = min(len(group) for group in by_node.values())
    # Devices in order: node by node, so that TP groups (consecutive ranks) stay inside a node.
    ordered = [d for node in by_node for d in by_node[node]]
    count = len(ordered)
    discarded: dict[str, int] = {}
    plans: list[Plan] = []

    def drop(reason: str) -> None:
        discarded[reason] = discarded.get(reason, 0) + 1

    for tp, pp in product(divisors(count), divisors(count)):
        if count % (tp * pp):
            continue
        dp = count // (tp * pp)
        if shape.attention_heads % tp or shape.kv_heads % tp:
            drop("tensor parallel does not divide the attention heads and KV heads")
            continue
        if tp > per_node:
            drop("tensor parallel would span nodes")
            continue
        if pp > shape.layers:
            drop("more pipeline stages than layers")
            continue
        if work.global_batch % dp:
            drop("the batch does not split evenly over data-parallel ranks")
            continue
        # Stage i holds devices [i*dp*tp, (i+1)*dp*tp): its slowest device sets its pace.
        group = tp * dp
        stage_tflops = [min(d.tflops for d in ordered[i * group:(i + 1) * group]) for i in range(pp)]
        layers = stage_layers(shape.layers, stage_tflops)
        stage_memory = [min(d.memory_bytes for d in ordered[i * group:(i + 1) * group]) for i in range(pp)]
        nodes_spanned = len({d.node for d in ordered})
        dp_nodes = len({d.node for d in ordered[:group]}) > 1 or (dp > 1 and nodes_spanned > 1 and pp == 1)
        per_rank = work.global_batch // dp
        for micro_batch, zero, recompute in product(divisors(per_rank), zero_stages, (False, True)):
            if zero and dp == 1:
                continue  # ZeRO shards over data-parallel ranks; with one there is nothing to shard
            if zero and work.method == "lora" and zero > 1:
                continue  # the adapter's gradients and state are tiny: stages past 1 change nothing
            m = per_rank // micro_batch
            worst_ratio, worst_memory, worst_limit = 0.0, 0, 0
            for index in range(pp):
                needed = memory_per_device(shape=shape, work=work, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
                                           micro_batches=m, zero=zero, recompute=recompute,
                                           layers_on_stage=layers[index], gpu=gpu)
                limit_bytes = (stage_memory[index] - GPU_RESERVED_BYTES if gpu
                               else stage_memory[index] * (1 - CPU_RESERVED_SHARE))
                if needed / limit_bytes > worst_ratio:
                    worst_ratio, worst_memory, worst_limit = needed / limit_bytes, needed, int(limit_bytes)
            if worst_ratio > 1:
                drop("does not fit in memory")
                continue
            tokens_micro = micro_batch * work.sequence_length
            flops_layer = _flops_per_token(shape, work, recompute) / shape.layers * tokens_micro
            stage_times = [flops_layer * layers[i] / (tp * stage_tflops[i] * 1e12 * efficiency) for i in range(pp)]
            slowest = max(stage_times)
            compute = slowest * m
            dtype = 2 if gpu else 4
            act_bytes = work.sequence_length * micro_batch * shape.hidden_size * dtype
            tp_comm = 4 * max(layers) * m * _ring_allreduce_s(act_bytes, tp, links.intra_node_gbps)
            trainable = (shape.parameters if work.method == "full"
                         else lora_parameters(shape, work.lora_rank, work.lora_targets)) / (tp * pp)
            dp_gbps = links.inter_node_gbps if dp_nodes else links.intra_node_gbps
            dp_comm = _ring_allreduce_s(trainable * dtype, dp, dp_gbps) * (1.5 if zero == 3 else 1.0)
            pp_gbps = links.inter_node_gbps if nodes_spanned > 1 and pp > 1 else links.intra_node_gbps
            pp_comm = 2 * (pp - 1) * m * act_bytes / (pp_gbps * 1e9) if pp > 1 else 0.0
            bubble = bubble_share(pp, m)
            overhead = (m + pp - 1) * max(layers) * (GPU_BLOCK_PASS_S if gpu else CPU_BLOCK_PASS_S)
            step = (m + pp - 1) * slowest + overhead + tp_comm + dp_comm + pp_comm
            plans.append(Plan(
                tensor_parallel=tp, pipeline_parallel=pp, data_parallel=dp, micro_batch=micro_batch,
                micro_batches=m, zero_stage=zero, recompute=recompute, stage_layers=layers,
                memory_per_device_bytes=worst_memory, memory_limit_bytes=worst_limit, compute_s=compute,
                overhead_s=overhead, tp_comm_s=tp_comm, dp_comm_s=dp_comm, pp_comm_s=pp_comm,
                bubble_share=bubble, step_time_s=step,
                tokens_per_s=work.global_batch * work.sequence_length / step, nodes=nodes_spanned))
    if not plans:
        reasons = ", ".join(f"{n} {reason}" for reason, n in discarded.items()) or "no layout"
        raise PlanError(f"No layout fits: {reasons}. Use more or larger devices, LoRA, a shorter sequence or a "
                        f"smaller batch.")
    # Fastest first; at equal speed the one that leaves more memory free.
    plans.sort(key=lambda p: (round(p.step_time_s, 9), p.memory_per_device_bytes))
    for rank, entry in enumerate(plans, start=1):
        entry.rank = rank
        entry.why = _why(entry, plans[0])
    return PlanResult(plans=plans[:limit], discarded=discarded)


def _why(entry: Plan, best: Plan) -> str:
    parts = {"compute": entry.compute_s, "per-pass overhead": entry.overhead_s, "TP communication": entry.tp_comm_s,
             "gradient all-reduce": entry.dp_comm_s, "pipeline transfers": entry.pp_comm_s}
    bubble_s = entry.step_time_s - sum(parts.values())
    if bubble_s > 1e-9:
        parts["pipeline bubble"] = bubble_s
    dominant = max(parts, key=parts.get)
    memory = f"{entry.memory_per_device_bytes / entry.memory_limit_bytes:.0%} of usable memory"
    if entry is best:
        return f"fastest estimate; {dominant} dominates ({parts[dominant]:.3g} s of {entry.step_time_s:.3g} s); " \
               f"{memory}"
    slower = entry.step_time_s / best.step_time_s - 1
    best_parts = {"compute": best.compute_s, "per-pass overhead": best.overhead_s, "TP communication": best.tp_comm_s,
                  "gradient all-reduce": best.dp_comm_s, "pipeline transfers": best.pp_comm_s}
    extra = {name: value - best_parts.get(name, best.step_time_s - sum(best_parts.values()))
             for name, value in parts.items()}
    cause = max(extra, key=extra.get)
    if extra[cause] <= 1e-12:
        return f"as fast as #1 but uses more memory ({memory})"
    return f"{slower:.0%} slower than #1, mostly more {cause} (+{extra[cause]:.3g} s); {memory}"
