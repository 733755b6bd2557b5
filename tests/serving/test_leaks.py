"""Issue 13, hole 10: /metrics needs a token or staff, and a shared deployment's page shows each workspace only its
own requests."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from serving import services
from serving.models import RequestRecord
from serving.presets import SMOLLM2, register_presets

pytestmark = pytest.mark.django_db


def _signed_in(username: str) -> Client:
    client = Client()
    client.login(username=username, password="correct-horse-battery")
    return client


def test_the_metrics_need_the_metrics_token_or_a_staff_sign_in(make_workspace, settings):
    settings.METRICS_TOKEN = "scrape-secret"
    make_workspace("Acme", owner="ann")
    assert Client().get("/metrics").status_code == 401
    assert _signed_in("ann").get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret").status_code == 200
    get_user_model().objects.filter(username="ann").update(is_staff=True)
    assert _signed_in("ann").get("/metrics").status_code == 200


def test_a_shared_deployments_page_lists_only_the_viewers_own_requests(make_workspace, settings):
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    model = register_presets(lambda line: None)[SMOLLM2]
    shared = services.create_deployment(actor=SYSTEM, workspace=None, model=model, name=SMOLLM2,
                                        replicas=[(node, 1.0)])
    acme, globex = make_workspace("Acme", owner="ann"), make_workspace("Globex", owner="bob")
    # The endpoint column tells the rows apart here.
    for workspace, endpoint in ((acme, "acme-endpoint"), (globex, "globex-endpoint")):
        RequestRecord.objects.create(deployment=shared, workspace=workspace, endpoint=endpoint, status=200)

    page = _signed_in("ann").get(f"/serving/deployments/{SMOLLM2}/").content.decode()
    assert "acme-endpoint" in page and "globex-endpoint" not in page
