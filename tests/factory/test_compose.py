"""No Docker engine runs here, so the appliance's compose file is checked against the processes `make run` starts."""

import re

import yaml

from tests.conftest import ROOT

FACTORY_ROLES = {"setup", "web", "node", "worker", "interactive", "beat"}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _roles_in_proc_sh() -> set[str]:
    text = (ROOT / "scripts" / "proc.sh").read_text()
    return set(re.findall(r"^  (\w+)\)$", text, flags=re.MULTILINE))


def _processes_started_by_make_run() -> set[str]:
    text = (ROOT / "scripts" / "run.sh").read_text()
    started = set(re.search(r'^PROCESSES="([^"]+)"', text, flags=re.MULTILINE).group(1).split())
    assert "scripts/proc.sh setup" in text
    return started | {"setup"}


def test_compose_has_the_appliance_services():
    services = _compose()["services"]
    assert set(services) == FACTORY_ROLES | {"redis", "postgres"}
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["redis"]["image"].startswith("redis:")
    assert all("healthcheck" in services[name] for name in ("redis", "postgres"))


def test_compose_runs_the_same_processes_as_make_run():
    services = _compose()["services"]
    commands = {name: services[name]["command"] for name in FACTORY_ROLES}
    assert all(command == [name] for name, command in commands.items())
    assert FACTORY_ROLES == _roles_in_proc_sh() == _processes_started_by_make_run()
    assert "ENTRYPOINT [\"scripts/proc.sh\"]" in (ROOT / "Dockerfile").read_text()


def test_compose_services_use_postgres_and_the_shared_redis():
    services = _compose()["services"]
    for name in ("web", "node", "worker", "interactive", "beat", "setup"):
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://"), name
        assert env["REDIS_URL"] == "redis://redis:6379/0", name
        assert env["FACTORY_ENV"] == "prod", name
    for name in ("web", "node", "worker", "interactive", "beat"):
        assert services[name]["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    assert services["setup"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_the_gpu_worker_is_documented_but_off():
    text = (ROOT / "docker-compose.yml").read_text()
    assert "# gpu-worker:" in text
    assert "#           - driver: nvidia" in text


def test_every_container_starts_in_prod_and_reaches_the_others_by_their_service_names():
    services = _compose()["services"]
    for name in FACTORY_ROLES:
        env = services[name]["environment"]
        # Settings refuse to start in prod without the hosts; the gateway is called as "web" by the other containers.
        assert "web" in env["FACTORY_ALLOWED_HOSTS"].split(","), name
        assert env["FACTORY_GATEWAY_URL"] == "http://web:8000/v1", name
        assert env["FACTORY_NODE_NAME"] == "appliance", name
    # The node's engines listen where the gateway in another container reaches them.
    assert services["node"]["environment"]["FACTORY_NODE_ADDRESS"] == "node"
