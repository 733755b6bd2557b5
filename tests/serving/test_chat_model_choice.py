"""Every form that offers chat models preselects the instruction-tuned SmolLM2 and labels the base Gemma-3-270M
"completion only", in English and in Chinese."""

import re

import pytest
from django.test import Client

from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from serving.models import Deployment, ServingState
from serving.presets import GEMMA3, SMOLLM2, register_presets
from serving.services import create_deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def ann(make_workspace) -> Client:
    make_workspace("Acme", owner="ann")
    node = register_node(name="box", resources=inventory.probe())
    models = register_presets(lambda line: None)
    for name in (GEMMA3, SMOLLM2):
        create_deployment(actor=SYSTEM, workspace=None, model=models[name], name=name, replicas=[(node, 1.0)])
    Deployment.objects.update(state=ServingState.READY)  # as started replicas would make them; no engine runs
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def options(page: str, select: str) -> list[tuple[str, str]]:
    """(value, label) of each option of the select whose opening tag contains `select`, in order."""
    start = page.index(select)
    body = page[start:page.index("</select>", start)]
    return re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', body)


@pytest.mark.parametrize("url, select", [
    ("/serving/playground/", 'id="pg-deployment"'),
    ("/rag/configs/new/", 'id="cfg-model"'),
    ("/agents/", 'id="agent-model"'),
])
def test_the_instruction_tuned_model_comes_first_and_the_base_model_says_what_it_is(ann, url, select):
    offered = options(ann.get(url).content.decode(), select)

    assert offered[0] == (SMOLLM2, f"{SMOLLM2} (recommended)")
    gemma = dict(offered)[GEMMA3]
    assert gemma.startswith(f"{GEMMA3} (completion only")


def test_the_labels_are_chinese_in_the_chinese_gui(ann):
    ann.cookies["django_language"] = "zh-hans"
    offered = dict(options(ann.get("/serving/playground/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode(),
                           'id="pg-deployment"'))
    assert "推荐" in offered[SMOLLM2] and "仅补全" in offered[GEMMA3]
