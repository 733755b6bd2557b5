"""New llama.cpp deployments on a GPU node start from the GPU defaults (every layer on the GPUs, flash attention,
slots sized to the GPUs' memory); on a CPU node nothing changes. The GPU node is a registration as its worker makes
it (its GPUs read from nvidia-smi's output, its llama-server reported as a CUDA build): no GPU is needed."""

from pathlib import Path

import pytest

from accounts.services import SYSTEM
from cluster import cpu_budget, inventory
from cluster.services import register_node
from serving import services
from serving.engines.base import Listen, engine
from serving.engines.llamacpp import GPU_DEFAULTS, MAX_GPU_MEMORY_SHARE
from serving.gguf_info import read_gguf
from serving.presets import SMOLLM2, register_presets

pytestmark = pytest.mark.django_db


def node(name: str, gpus: str = "", *, llama_cuda: bool = True):
    reading = inventory.Resources(hostname=name, cpu_cores=16, memory_bytes=64 * 2**30,
                                  memory_available_bytes=32 * 2**30, load_average=[0.0, 0.0, 0.0],
                                  gpus=inventory.parse_nvidia_smi(gpus), llama_cuda=llama_cuda and bool(gpus))
    return register_node(name=name, resources=reading)


H100 = "0, NVIDIA H100 80GB HBM3, 81559, GPU-1f7a6c1e-0d2b-4a7b-9b8e-3c1d2e4f5a6b\n"


@pytest.fixture
def smollm2():
    return register_presets(lambda line: None)[SMOLLM2]


def deploy(model, where, name: str, settings: dict | None = None):
    return services.create_deployment(actor=SYSTEM, workspace=None, model=model, name=name, settings_=settings,
                                      replicas=[(n, 1.0) for n in where])


def command_line(deployment, tmp_path: Path) -> list[str]:
    key = tmp_path / "key"
    key.write_text("k\n")
    spec = engine("llamacpp").launch_spec(model=deployment.model, settings=deployment.settings,
                                          served_name=deployment.name,
                                          listen=Listen(host="127.0.0.1", port=9999, key_file=key))
    return spec.argv


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_a_deployment_on_a_gpu_node_offloads_every_layer_with_gpu_settings(smollm2, tmp_path):
    deployment = deploy(smollm2, [node("gpu-box", H100)], "on-gpu")

    # 32 slots of SmolLM2's 4,096-token context: the KV budget of 131,072 tokens, which an H100 holds easily.
    assert deployment.settings == {**GPU_DEFAULTS, "parallel": 32}
    argv = command_line(deployment, tmp_path)
    assert flag(argv, "--n-gpu-layers") == "999" and flag(argv, "--flash-attn") == "auto"
    assert (flag(argv, "--parallel"), flag(argv, "--ctx-size")) == ("32", str(32 * 4096))
    assert (flag(argv, "--batch-size"), flag(argv, "--ubatch-size")) == ("2048", "512")
    assert "--backend-sampling" not in argv


def test_a_deployment_on_a_cpu_node_is_launched_as_before(smollm2, tmp_path):
    deployment = deploy(smollm2, [node("cpu-box")], "on-cpu")
    assert deployment.settings == {}
    argv = command_line(deployment, tmp_path)
    # The node's engine threads (cluster/cpu_budget.py), four slots at least; nothing on a GPU; no GPU flag at all.
    threads = cpu_budget.budget().engine_threads
    assert (flag(argv, "--n-gpu-layers"), flag(argv, "--parallel"), flag(argv, "--threads")) == (
        "0", str(min(8, 2 * max(threads, 2))), str(threads))
    assert not {"--flash-attn", "--batch-size", "--ubatch-size", "--backend-sampling"} & set(argv)


def test_gpus_whose_llama_server_has_no_cuda_or_a_mixed_deployment_get_no_gpu_defaults(smollm2):
    assert deploy(smollm2, [node("gpu-no-cuda", H100, llama_cuda=False)], "no-cuda").settings == {}
    assert deploy(smollm2, [node("gpu-box", H100), node("cpu-box")], "mixed").settings == {}


def test_the_deployments_own_settings_win(smollm2, tmp_path):
    gpu = node("gpu-box", H100)
    chosen = deploy(smollm2, [gpu], "chosen", {"parallel": 6, "flash_attn": "on", "backend_sampling": True})
    assert chosen.settings == {**GPU_DEFAULTS, "parallel": 6, "flash_attn": "on", "backend_sampling": True}
    argv = command_line(chosen, tmp_path)
    assert (flag(argv, "--parallel"), flag(argv, "--flash-attn")) == ("6", "on") and "--backend-sampling" in argv
    # A deployment kept off the GPU: no layers there, and the CPU's slots.
    cpu_only = deploy(smollm2, [gpu], "cpu-only", {"gpu_layers": 0})
    assert cpu_only.settings["gpu_layers"] == 0 and "parallel" not in cpu_only.settings
    assert flag(command_line(cpu_only, tmp_path), "--parallel") == "4"


def test_slots_are_as_many_as_the_smallest_gpu_holds_and_more_are_refused(smollm2):
    small = "0, Small Accelerator, 2048, GPU-00000000-0000-0000-0000-000000000001\n"
    per_slot = read_gguf(Path(smollm2.path)).kv_bytes_per_token * 4096
    room = 2048 * 2**20 * MAX_GPU_MEMORY_SHARE - smollm2.size_bytes
    deployment = deploy(smollm2, [node("small-gpu", small)], "small")
    assert deployment.settings["parallel"] == int(room // per_slot) < 32

    with pytest.raises(services.ValidationFailed, match="of GPU memory free for it"):
        deploy(smollm2, [node("small-gpu-2", small)], "too-many", {"parallel": 64})
    with pytest.raises(services.ValidationFailed, match="'flash_attn' must be one of on, off, auto"):
        deploy(smollm2, [node("gpu-box", H100)], "bad-fa", {"flash_attn": "yes"})


def test_the_node_worker_reports_its_llama_server_build_in_the_pool(monkeypatch):
    monkeypatch.setattr(inventory, "_read_gpus", lambda: (inventory.parse_nvidia_smi(H100), ""))
    monkeypatch.setattr(inventory, "llama_server_has_cuda", lambda binary=None: True)
    registered = register_node(name="probed", resources=inventory.probe())
    assert registered.info["llama_cuda"] is True and registered.devices.count() == 1
    monkeypatch.setattr(inventory, "_read_gpus", lambda: ([], ""))
    assert register_node(name="probed-cpu", resources=inventory.probe()).info["llama_cuda"] is False
