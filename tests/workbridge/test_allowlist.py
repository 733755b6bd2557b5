"""A workspace's egress allowlist: admins set it, and it is what lets an external model on an intranet address be
registered and called."""

import ipaddress

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


@pytest.mark.parametrize("entry, stored", [
    ("127.0.0.1:8081", "127.0.0.1/32:8081"), ("10.0.0.0/8:8000-8100", "10.0.0.0/8:8000-8100"),
    ("API.corp.example:8443", "api.corp.example:8443"), ("[::1]:8081", "[::1/128]:8081"), ("::1", "::1/128"),
])
def test_an_entry_may_name_a_port_or_a_port_range(acme, key_client, entry, stored):
    added = key_client("ann", acme, role=Role.ADMIN).post(RULES, {"entry": entry}, format="json")
    assert (added.status_code, added.json()["entry"]) == (201, stored)


@pytest.mark.parametrize("entry, message", [
    ("127.0.0.1:http", "a port is a number"), ("127.0.0.1:0", "ports run from 1 to 65535"),
    ("127.0.0.1:9000-8000", "the lower first"), ("[::1]8081", "[address]:port"),
])
def test_a_bad_port_is_a_400_saying_why(acme, key_client, entry, message):
    refused = key_client("ann", acme, role=Role.ADMIN).post(RULES, {"entry": entry}, format="json")
    assert refused.status_code == 400 and message in refused.json()["error"]["message"]


def test_an_entry_opens_only_its_ports_and_never_the_platforms_own_unless_the_operator_names_one():
    own = dict(own_ports={8000, 6379})
    address = ipaddress.ip_address("127.0.0.1")
    one_service = egress.Allowlist.of(["127.0.0.1:8081"], **own)
    assert one_service.permits("127.0.0.1", address, 8081)
    assert not one_service.permits("127.0.0.1", address, 8082) and not one_service.permits("127.0.0.1", address, 8000)
    whole_address = egress.Allowlist.of(["127.0.0.1"], **own)
    assert whole_address.permits("127.0.0.1", address, 9999)
    assert not whole_address.permits("127.0.0.1", address, 8000) and not whole_address.permits("x", address, 6379)
    assert not egress.Allowlist.of(["127.0.0.1:8000"], **own).permits("127.0.0.1", address, 8000)
    operator = egress.Allowlist.of([], operator_entries=["127.0.0.1:8000"], **own)
    assert operator.permits("127.0.0.1", address, 8000) and not operator.permits("127.0.0.1", address, 6379)
    # Elsewhere the platform's port numbers are ordinary ports.
    intranet = egress.Allowlist.of(["10.0.0.0/8"], **own)
    assert intranet.permits("10.1.2.3", ipaddress.ip_address("10.1.2.3"), 8000)


def test_the_platforms_web_port_stays_shut_to_a_workspace_rule_for_loopback(acme, key_client, settings):
    admin = key_client("ann", acme, role=Role.ADMIN)
    admin.post(RULES, {"entry": "127.0.0.0/8"}, format="json")
    tool = admin.post("/api/workbridge/tools/", {
        "name": "own_api", "description": "The platform's own API.", "parameters": {"type": "object"},
        "config": {"method": "GET", "url": f"http://127.0.0.1:{settings.WEB_PORT}/api/auth/me/"}},
        format="json").json()
    called = admin.post(f"/api/workbridge/tools/{tool['id']}/invoke/", {"arguments": {}}, format="json").json()
    assert called["invocation"]["status"] == "failed"
    assert f"(port {settings.WEB_PORT})" in called["invocation"]["error"]


def test_an_unreadable_url_as_a_tool_or_spec_url_is_a_recorded_failure_or_a_400_never_a_500(acme, key_client):
    admin = key_client("ann", acme, role=Role.ADMIN)
    tool = admin.post("/api/workbridge/tools/", {
        "name": "octal", "description": "An octal loopback.", "parameters": {"type": "object"},
        "config": {"method": "GET", "url": "http://0177.0.0.1:8081/x"}}, format="json")
    if tool.status_code == 201:
        called = admin.post(f"/api/workbridge/tools/{tool.json()['id']}/invoke/", {"arguments": {}}, format="json")
        assert called.status_code == 200 and called.json()["invocation"]["status"] == "failed"
        assert "not a valid URL" in called.json()["invocation"]["error"]
    else:
        assert tool.status_code == 400
    spec = admin.post("/api/workbridge/specs/preview/", {"url": "http://0177.0.0.1:8081/openapi.json"},
                      format="json")
    assert spec.status_code == 400 and "not a valid URL" in spec.json()["error"]["message"]
