"""The planner against cases computed by hand from the formulas in enhancement/planner.py."""

import pytest

from enhancement.planner import (
    GIB,
    Device,
    ModelShape,
    PlanError,
    Workload,
    allowed_tensor_parallel,
    bubble_share,
    lora_parameters,
    memory_per_device,
    plan,
    stage_layers,
)

SMOLLM2 = ModelShape(parameters=134_515_008, layers=30, hidden_size=576, attention_heads=9, kv_heads=3,
                     vocab_size=49152, intermediate_size=1536)
LLAMA_7B = ModelShape(parameters=6_738_415_616, layers=32, hidden_size=4096, attention_heads=32, kv_heads=32,
                      vocab_size=32000, intermediate_size=11008)


def gpus(count: int, memory_gb: float = 80, tflops: float = 312, node: str = "n1") -> list[Device]:
    return [Device(node=node, name=f"gpu{i}", memory_bytes=int(memory_gb * GIB), tflops=tflops) for i in range(count)]


def test_smollm2_allows_tensor_parallel_1_or_3_only():
    assert allowed_tensor_parallel(SMOLLM2, limit=8) == [1, 3]
    result = plan(shape=SMOLLM2, work=Workload(method="full", sequence_length=1024, global_batch=12),
                  devices=gpus(6), limit=1000)
    assert {p.tensor_parallel for p in result.plans} == {1, 3}
    assert result.discarded["tensor parallel does not divide the attention heads and KV heads"] > 0


def test_the_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    assert bubble_share(4, 4) == pytest.approx(3 / 7)
    assert bubble_share(1, 8) == 0
    assert bubble_share(8, 1) == pytest.approx(7 / 8)


def test_heterogeneous_devices_get_pipeline_stages_in_proportion_to_their_compute():
    assert stage_layers(32, [300.0, 100.0]) == [24, 8]
    assert stage_layers(30, [1.0, 1.0, 1.0]) == [10, 10, 10]
    mixed = gpus(1, tflops=300, node="a") + gpus(1, tflops=100, node="b")
    result = plan(shape=LLAMA_7B, work=Workload(method="lora", sequence_length=2048, global_batch=8), devices=mixed,
                  limit=1000)
    two_stage = [p for p in result.plans if p.pipeline_parallel == 2]
    assert two_stage and all(p.stage_layers == [24, 8] for p in two_stage)


def test_memory_of_7b_full_training_with_tp8_on_8x80gb_matches_the_hand_count():
    # Weights 2 + gradients 2 + Adam 12 bytes per parameter, over TP 8 (embeddings included once, pp = 1):
    params = (LLAMA_7B.parameters + 32000 * 4096) / 8
    states = params * 16
    # Full recompute: 2·s·b·h per layer kept, plus one layer rebuilt: s·b·h·(10 + 24/8 + 5·a·s/(h·8)).
    s, h, a = 4096, 4096, 32
    activations = 2 * s * h * 32 + s * h * (10 + 24 / 8 + 5 * a * s / (h * 8))
    logits = 2 * s * 32000 * 4 / 8
    expected = int(states + activations + logits)
    got = memory_per_device(shape=LLAMA_7B, work=Workload(method="full", sequence_length=s, global_batch=8), tp=8,
                            pp=1, dp=1, micro_batch=1, micro_batches=8, zero=0, recompute=True, layers_on_stage=32,
                            gpu=True)
    assert got == expected
    assert 14 * GIB < got < 15 * GIB  # 15.5e9 bytes


def test_7b_full_training_does_not_fit_one_80gb_gpu_but_fits_eight():
    work = Workload(method="full", sequence_length=4096, global_batch=64)
    with pytest.raises(PlanError, match="does not fit in memory"):
        plan(shape=LLAMA_7B, work=work, devices=gpus(1))
    result = plan(shape=LLAMA_7B, work=work, devices=gpus(8))
    best = result.plans[0]
    assert best.tensor_parallel * best.pipeline_parallel * best.data_parallel == 8
    assert best.memory_per_device_bytes <= best.memory_limit_bytes
    assert best.why.startswith("fastest estimate")
    assert [p.step_time_s for p in result.plans] == sorted(p.step_time_s for p in result.plans)
    assert "slower than #1" in result.plans[-1].why or "as fast as #1" in result.plans[-1].why


def test_lora_trains_only_the_adapter_matrices():
    # r·(d_in + d_out) per targeted module per layer: q is 576→576, v is 576→192 (3 KV heads × 64).
    assert lora_parameters(SMOLLM2, 8, ("q_proj", "v_proj")) == 30 * (8 * (576 + 576) + 8 * (576 + 192))


def test_a_plan_that_cannot_fit_says_why():
    tiny = [Device(node="n", name="cpu", memory_bytes=64 * 1024 ** 2, tflops=0.1, kind="cpu")]
    with pytest.raises(PlanError, match="No layout fits: .*does not fit in memory"):
        plan(shape=SMOLLM2, work=Workload(method="full", sequence_length=512, global_batch=4), devices=tiny)


def test_on_a_cpu_fewer_larger_micro_batches_rank_first_and_the_overhead_is_counted_per_pass():
    from enhancement.planner import CPU_BLOCK_PASS_S, CPU_CORE_TFLOPS

    cpu = [Device(node="n", name="2 cores", memory_bytes=24 * GIB, tflops=2 * CPU_CORE_TFLOPS, kind="cpu")]
    result = plan(shape=SMOLLM2, work=Workload(method="lora", sequence_length=256, global_batch=4), devices=cpu)
    by_micro_batch = {p.micro_batch: p for p in result.plans if not p.recompute}
    assert result.plans[0].micro_batch == 4 and not result.plans[0].recompute
    # The same FLOPs in 1, 2 or 4 passes: each pass through the 30 blocks costs 30 × CPU_BLOCK_PASS_S more.
    assert by_micro_batch[1].compute_s == pytest.approx(by_micro_batch[4].compute_s)
    assert by_micro_batch[1].overhead_s == pytest.approx(4 * 30 * CPU_BLOCK_PASS_S)
    assert by_micro_batch[1].step_time_s - by_micro_batch[4].step_time_s == pytest.approx(3 * 30 * CPU_BLOCK_PASS_S)
    assert "per-pass overhead" in by_micro_batch[1].why
