"""Issue 49: a node's cores by kind of work. Engines serving chats come first, pinned to cores of their own with
threads sized to them; background work (the ingestion and interactive workers, training) yields with a higher nice
value and batch scheduling; the node's page says how its cores are shared. The processes are real."""

import os
import signal
import subprocess
from types import SimpleNamespace

import psutil
import pytest
from django.test import Client

from accounts.services import SYSTEM
from cluster import cpu_budget, inventory
from cluster.services import record_heartbeat, register_node
from serving import services as serving_services
from serving.engines import process
from serving.models import Replica
from serving.presets import SMOLLM2, register_presets
from tests.conftest import ROOT, _database_env, wait_for

pytestmark = pytest.mark.django_db
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


@pytest.mark.parametrize("cores, engine_cores, engine_threads, background_threads", [
    (1, 1, 1, 1), (2, 2, 1, 1), (8, 6, 3, 2), (64, 48, 8, 16)])
def test_a_nodes_cores_are_shared_by_default_with_engines_first(cores, engine_cores, engine_threads,
                                                                background_threads):
    plan = cpu_budget.budget(environ={}, cores=tuple(range(cores)))
    assert (len(plan.engine_cores), plan.engine_threads, plan.background_threads, plan.background_nice) == (
        engine_cores, engine_threads, background_threads, 10)


def test_the_budget_can_be_set_and_a_setting_it_cannot_use_says_why():
    cores = tuple(range(8))
    plan = cpu_budget.budget(environ={"FACTORY_ENGINE_CORES": "0-3,6", "FACTORY_ENGINE_THREADS": "2",
                                      "FACTORY_BACKGROUND_THREADS": "3", "FACTORY_BACKGROUND_NICE": "15"}, cores=cores)
    assert (plan.engine_cores, plan.engine_threads, plan.background_threads, plan.background_nice) == (
        (0, 1, 2, 3, 6), 2, 3, 15)
    assert cpu_budget.budget(environ={"FACTORY_ENGINE_CORES": "4"}, cores=cores).engine_cores == (0, 1, 2, 3)
    for setting, problem in [({"FACTORY_ENGINE_CORES": "9-12"}, "names CPUs"), ({"FACTORY_ENGINE_CORES": "all"},
                             "a count or a CPU list"), ({"FACTORY_ENGINE_THREADS": "0"}, "positive whole number"),
                             ({"FACTORY_BACKGROUND_NICE": "-5"}, "from 0 to 19")]:
        with pytest.raises(cpu_budget.BudgetRefused, match=problem):
            cpu_budget.budget(environ=setting, cores=cores)


def test_replicas_get_engine_cores_of_their_own_while_there_are_enough_then_share_evenly():
    plan = cpu_budget.budget(environ={"FACTORY_ENGINE_CORES": "0-3"}, cores=tuple(range(8)))
    taken = []
    for expected in [(0, 1), (2, 3), (0, 1), (2, 3)]:
        cpus = cpu_budget.assign_engine_cores(2, taken, plan)
        assert cpus == expected
        taken.append(set(cpus))
    assert cpu_budget.assign_engine_cores(16, taken, plan) == (0, 1, 2, 3)  # never beyond the engine cores


@pytest.mark.skipif(not TWO_CORES, reason="pinning two replicas apart needs two usable cores")
def test_two_presets_started_on_two_cores_are_pinned_apart_with_a_thread_each_and_a_third_shares(monkeypatch):
    monkeypatch.delenv("FACTORY_ENGINE_CORES", raising=False)
    monkeypatch.delenv("FACTORY_ENGINE_THREADS", raising=False)
    monkeypatch.setattr(cpu_budget, "usable_cores", lambda: tuple(sorted(os.sched_getaffinity(0)))[:2])
    node = register_node(name="pytest-cores", resources=inventory.probe())
    model = register_presets(lambda line: None)[SMOLLM2]
    replicas = [serving_services.create_deployment(actor=SYSTEM, workspace=None, model=model, name=f"cores-{n}",
                                                   replicas=[(node, 1.0)]).replicas.get() for n in range(3)]
    try:
        engines = []
        for replica in replicas:  # what the node worker does with each start job
            serving_services.start_replica(SimpleNamespace(payload={"replica_id": replica.pk}), lambda *_: None)
            engines.append(psutil.Process(Replica.objects.get(pk=replica.pk).pid))
        first, second, third = engines
        assert {tuple(first.cpu_affinity()), tuple(second.cpu_affinity())} == {
            tuple(cpu_budget.usable_cores()[:1]), tuple(cpu_budget.usable_cores()[1:2])}
        for engine in engines:
            argv = engine.cmdline()
            assert argv[argv.index("--threads") + 1] == "1"
        # Alone on their cores the first two spin between tokens; the third shares a core, so it sleeps.
        assert "OMP_WAIT_POLICY" not in first.environ() and "OMP_WAIT_POLICY" not in second.environ()
        assert third.environ().get("OMP_WAIT_POLICY") == "PASSIVE" and len(third.cpu_affinity()) == 1
    finally:
        for replica in Replica.objects.filter(pk__in=[r.pk for r in replicas]):
            process.terminate(replica.pid)


def test_the_ingestion_worker_make_run_starts_yields_the_cores_to_the_engines(tmp_path):
    """scripts/proc.sh worker, as make run starts it, on a Redis database of its own (it must not take the other
    tests' messages): the Celery process and its pool processes run niced and with batch scheduling."""
    redis_url = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/13"
    env = {**os.environ, **_database_env(), "REDIS_URL": redis_url, "FACTORY_WORKER_CONCURRENCY": "1",
           "FACTORY_NODE_NAME": "pytest-budget", "FACTORY_DATA_DIR": str(tmp_path)}
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(["scripts/proc.sh", "worker"], cwd=ROOT, env=env, stdout=log.open("wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        pool = wait_for(lambda: _celery_pool(worker.pid), timeout=90, what="the worker's pool processes")
        # A process can only raise its nice value: run under a niced test session, the worker keeps that one.
        expected_nice = max(cpu_budget.DEFAULT_BACKGROUND_NICE, os.getpriority(os.PRIO_PROCESS, 0))
        for member in [psutil.Process(worker.pid), *pool]:
            assert member.nice() == expected_nice
            assert os.sched_getscheduler(member.pid) == os.SCHED_BATCH
    finally:
        # Killed outright: a worker still starting defers SIGTERM, and how it stops is not what this test is about.
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)


def _celery_pool(pid: int) -> list[psutil.Process]:
    """The pool processes of the Celery worker `pid` has become (scripts/proc.sh execs it), once forked."""
    try:
        main = psutil.Process(pid)
        if "celery" not in " ".join(main.cmdline()):
            return []
        return [child for child in main.children() if "celery" in " ".join(child.cmdline())]
    except psutil.NoSuchProcess:  # a child of the script's start that ended meanwhile
        return []


def test_the_nodes_page_says_how_its_cores_are_shared(admin_client: Client):
    record_heartbeat(name="pytest-page", resources=inventory.probe())
    plan = cpu_budget.budget()
    page = admin_client.get("/cluster/").content.decode()
    assert f"engines on {len(plan.engine_cores)} cores, {plan.engine_threads} thread(s) a replica" in page
    assert f"nice {plan.background_nice}" in page
