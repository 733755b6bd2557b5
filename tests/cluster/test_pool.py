from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from cluster import inventory
from cluster.models import Node, NodeStatus
from cluster.services import mark_stale_nodes, record_heartbeat, register_node

pytestmark = pytest.mark.django_db

# Recorded from `nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits` on a mixed box.
NVIDIA_SMI_OUTPUT = """\
0, NVIDIA H100 80GB HBM3, 81559, GPU-1f7a6c1e-0d2b-4a7b-9b8e-3c1d2e4f5a6b
1, NVIDIA L4, 23034, GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4
2, Some Future Accelerator, 16384, GPU-00000000-0000-0000-0000-000000000000
"""


def _reading(gpus=()) -> inventory.Resources:
    return inventory.Resources(hostname="box", cpu_cores=16, memory_bytes=64 * 2**30,
                               memory_available_bytes=32 * 2**30, load_average=[0.1, 0.2, 0.3], gpus=list(gpus))


def test_gpus_are_read_from_nvidia_smi_with_name_memory_and_compute():
    gpus = inventory.parse_nvidia_smi(NVIDIA_SMI_OUTPUT)
    assert [(g.index, g.name, g.memory_bytes // 2**20) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", 81559), (1, "NVIDIA L4", 23034), (2, "Some Future Accelerator", 16384)]
    assert [g.compute_tflops for g in gpus] == [989.0, 121.0, None]
    assert inventory.gpu_tflops("NVIDIA H100 PCIe") == 756.0


def test_the_local_machine_is_probed_for_cores_and_memory():
    reading = inventory.probe()
    assert reading.cpu_cores >= 1
    assert reading.memory_bytes > reading.memory_available_bytes > 0


def test_a_node_registers_its_devices_and_keeps_them_in_step():
    gpus = inventory.parse_nvidia_smi(NVIDIA_SMI_OUTPUT)
    node = register_node(name="gpu-box", resources=_reading(gpus))
    assert node.queue == "node.gpu-box"
    assert list(node.devices.values_list("name", flat=True)) == [g.name for g in gpus]

    node = record_heartbeat(name="gpu-box", resources=_reading(gpus[:1]))
    assert node.devices.count() == 1


def test_a_node_that_misses_heartbeats_turns_unhealthy_and_recovers_on_the_next():
    register_node(name="quiet", resources=_reading())
    register_node(name="lively", resources=_reading())
    Node.objects.filter(name="quiet").update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))

    assert mark_stale_nodes(timeout_s=60) == ["quiet"]
    assert Node.objects.get(name="quiet").status == NodeStatus.UNHEALTHY
    assert Node.objects.get(name="lively").status == NodeStatus.HEALTHY

    record_heartbeat(name="quiet", resources=_reading())
    assert Node.objects.get(name="quiet").status == NodeStatus.HEALTHY


def test_the_pool_api_lists_nodes_with_devices(make_workspace):
    make_workspace("Acme", owner="ann")
    register_node(name="gpu-box", resources=_reading(inventory.parse_nvidia_smi(NVIDIA_SMI_OUTPUT)))
    client = APIClient()
    client.login(username="ann", password="correct-horse-battery")
    node = client.get("/api/cluster/nodes/gpu-box/").json()
    assert node["queue"] == "node.gpu-box"
    assert node["devices"][0]["compute_tflops"] == 989.0
    assert client.get("/api/cluster/nodes/missing/").status_code == 404


def test_dispatching_an_unknown_kind_or_to_a_sick_node_is_refused(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann")
    client = key_client("ann", workspace)
    register_node(name="gpu-box", resources=_reading())

    unknown = client.post("/api/cluster/jobs/", {"kind": "mine.bitcoin", "node": "gpu-box"}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["message"].startswith("Unknown job kind 'mine.bitcoin'")

    missing = client.post("/api/cluster/jobs/", {"kind": "node.inventory", "node": "nowhere"}, format="json")
    assert missing.status_code == 400
    assert "node" in missing.json()["error"]["fields"]

    Node.objects.filter(name="gpu-box").update(status=NodeStatus.UNHEALTHY)
    sick = client.post("/api/cluster/jobs/", {"kind": "node.inventory", "node": "gpu-box"}, format="json")
    assert sick.status_code == 409
    assert "unhealthy" in sick.json()["error"]["message"]
