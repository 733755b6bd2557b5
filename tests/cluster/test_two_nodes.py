"""The pool across machines, on one machine: two Celery workers as two nodes advertising different loopback addresses
(127.0.0.2 and 127.0.0.3), each running a replica of one deployment. The gateway in the web process splits the traffic
between the nodes' replicas at their advertised addresses, and when one node's worker and replica are killed every
request still gets its answer from the other."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model

from accounts.services import SYSTEM, Actor, create_api_key, create_workspace
from cluster.models import Node
from serving import services as serving
from serving.models import Deployment, Replica, RequestRecord, ServingState
from serving.presets import SMOLLM2, register_presets
from tests.conftest import ROOT, platform_env, stop_engines_and_flush, wait_for

pytestmark = pytest.mark.worker
NODES = {"node-a": "127.0.0.2", "node-b": "127.0.0.3"}


def _node_worker(name: str, address: str, env: dict) -> subprocess.Popen:
    log = Path(os.environ["FACTORY_DATA_DIR"]) / f"worker-{name}.log"
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "factory", "worker", "--queues", f"node.{name}", "--hostname",
         f"worker@{name}", "--concurrency", "1", "--without-gossip", "--without-mingle"],
        cwd=ROOT, env={**os.environ, **env, "FACTORY_NODE_NAME": name, "FACTORY_NODE_ADDRESS": address},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def two_nodes(web_server, web_port, django_db_blocker):
    workers = {name: _node_worker(name, address, platform_env(web_port)) for name, address in NODES.items()}
    with django_db_blocker.unblock():
        try:
            wait_for(lambda: Node.objects.filter(name__in=NODES).count() == 2, timeout=90,
                     what="both workers to register their nodes")
            models = register_presets(lambda line: None)
            nodes = [Node.objects.get(name=name) for name in NODES]
            deployment = serving.create_deployment(actor=SYSTEM, workspace=None, model=models[SMOLLM2],
                                                   name="spread", replicas=[(node, 1.0) for node in nodes],
                                                   cooldown_s=30)
            serving.start_deployment(actor=SYSTEM, deployment=deployment)
            wait_for(lambda: Deployment.objects.get(pk=deployment.pk).replicas.filter(
                state=ServingState.READY).count() == 2, timeout=240, what="a ready replica on each node")
            owner = get_user_model().objects.create_user(username="pool-owner", password="x" * 12)
            workspace = create_workspace(actor=Actor(user=owner), name="Pool")
            key = create_api_key(actor=Actor(user=owner), workspace=workspace, name="pool").secret
            yield {"url": web_server, "key": key, "deployment": deployment, "workers": workers}
        finally:
            for worker in workers.values():
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
            stop_engines_and_flush()


def _ask(two_nodes, count: int) -> list[int]:
    statuses = []
    with httpx.Client(base_url=f"{two_nodes['url']}/v1", timeout=120,
                      headers={"Authorization": f"Bearer {two_nodes['key']}"}) as client:
        for n in range(count):
            answer = client.post("/chat/completions", json={
                "model": "spread", "max_tokens": 4, "messages": [{"role": "user", "content": f"Say {n}."}]})
            statuses.append(answer.status_code)
    return statuses


def test_each_node_serves_at_its_own_address_and_the_gateway_splits_between_them(two_nodes, live_db):
    replicas = {replica.node.name: replica for replica in Replica.objects.filter(deployment=two_nodes["deployment"])
                .select_related("node")}
    assert {name: replica.base_url.split("//")[1].split(":")[0] for name, replica in replicas.items()} == NODES

    statuses = _ask(two_nodes, 24)

    assert statuses == [200] * 24
    wait_for(lambda: RequestRecord.objects.filter(deployment=two_nodes["deployment"]).count() >= 24, timeout=30,
             what="the gateway's request records")
    served = {name: RequestRecord.objects.filter(replica=replicas[name]).count() for name in NODES}
    assert all(count >= 3 for count in served.values()), served


def test_when_one_node_dies_with_its_replica_the_other_answers_every_request(two_nodes, live_db):
    dead = Replica.objects.select_related("node").get(deployment=two_nodes["deployment"], node__name="node-a")
    os.killpg(two_nodes["workers"]["node-a"].pid, signal.SIGKILL)
    os.kill(dead.pid, signal.SIGKILL)
    last = RequestRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0

    statuses = _ask(two_nodes, 20)

    assert statuses == [200] * 20
    after = RequestRecord.objects.filter(pk__gt=last, deployment=two_nodes["deployment"])
    wait_for(lambda: after.count() >= 20, timeout=30, what="the gateway's request records")
    assert set(after.values_list("replica__node__name", flat=True)) == {"node-b"}
