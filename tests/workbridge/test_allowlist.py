"""A workspace's egress allowlist: admins set it, and it is what lets an external model on an intranet address be
registered and called."""

import pytest

from accounts.models import AuditEntry, Role
from workbridge import egress

pytestmark = pytest.mark.django_db
RULES = "/api/workbridge/egress-rules/"


@pytest.fixture
def acme(make_workspace):
    return make_workspace("Acme", owner="ann", dev="developer")


@pytest.fixture
def intranet_dns():
    egress.use_resolver(lambda host, port: {"llm.corp.example": ["10.1.2.3"]}.get(host) or [host])
    yield
    egress.use_resolver(None)


def test_admins_add_and_remove_entries_and_each_change_is_audited(acme, key_client):
    admin = key_client("ann", acme, role=Role.ADMIN)

    added = admin.post(RULES, {"entry": "*.Corp.example", "note": "intranet"}, format="json")
    network = admin.post(RULES, {"entry": "10.1.0.0/16"}, format="json")
    again = admin.post(RULES, {"entry": "*.corp.example"}, format="json")

    assert (added.status_code, added.json()["entry"]) == (201, "*.corp.example")
    assert network.json()["entry"] == "10.1.0.0/16" and again.status_code == 409
    assert [r["entry"] for r in admin.get(RULES).json()["results"]] == ["*.corp.example", "10.1.0.0/16"]
    assert admin.delete(f"{RULES}{added.json()['id']}/").status_code == 204
    assert list(AuditEntry.objects.filter(action__startswith="egress_rule").values_list("action", flat=True)
                .order_by("id")) == ["egress_rule.add", "egress_rule.add", "egress_rule.remove"]


@pytest.mark.parametrize("entry", ["", "not a host", "http://x.example/", "a..b", "*."])
def test_an_entry_that_is_no_host_or_network_is_a_400(acme, key_client, entry):
    response = key_client("ann", acme, role=Role.ADMIN).post(RULES, {"entry": entry}, format="json")
    assert response.status_code == 400


def test_developers_cannot_open_the_allowlist_and_strangers_cannot_see_or_remove_it(acme, key_client,
                                                                                    make_workspace):
    rule = key_client("ann", acme, role=Role.ADMIN).post(RULES, {"entry": "10.0.0.0/8"}, format="json").json()
    stranger = key_client("zed", make_workspace("Other", owner="zed"))

    assert key_client("dev", acme).post(RULES, {"entry": "192.168.0.0/16"}, format="json").status_code == 403
    assert key_client("dev", acme).delete(f"{RULES}{rule['id']}/").status_code == 403
    assert stranger.delete(f"{RULES}{rule['id']}/").status_code == 404


def test_an_intranet_model_endpoint_registers_only_once_the_workspace_allows_it(acme, key_client, intranet_dns):
    admin = key_client("ann", acme, role=Role.ADMIN)
    model = {"name": "big-remote", "url": "https://llm.corp.example/v1", "api_key": "sk-x"}

    refused = admin.post("/api/serving/models/", model, format="json")
    admin.post(RULES, {"entry": "llm.corp.example"}, format="json")
    allowed = admin.post("/api/serving/models/", model, format="json")

    assert refused.status_code == 400
    assert "resolves to 10.1.2.3, which is not a public address" in refused.json()["error"]["message"]
    assert allowed.status_code == 201 and "api_key" not in allowed.json()


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "http://169.254.169.254/latest",
                                 "https://llm.corp.example/v1?x=", "https://llm.corp.example/v1#frag"])
def test_loopback_metadata_and_path_swallowing_model_urls_are_refused(acme, key_client, intranet_dns, url):
    admin = key_client("ann", acme, role=Role.ADMIN)
    admin.post(RULES, {"entry": "llm.corp.example"}, format="json")
    response = admin.post("/api/serving/models/", {"name": "sneaky", "url": url}, format="json")
    assert response.status_code == 400
