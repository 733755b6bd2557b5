""""Publish as an app" from an agent's or a RAG config's page opens the Apps page with that very source chosen, so
that Publish publishes what the user was building."""

import re

import pytest
from django.test import Client

from agent_studio import services as agent_services
from serving.presets import SMOLLM2
from tests.runtime.conftest import save_config

pytestmark = pytest.mark.django_db


def chosen_source(page: str) -> list[str]:
    select = page[page.index('id="publish-config"'):page.index("</select>", page.index('id="publish-config"'))]
    return re.findall(r'<option value="([^"]+)" selected>', select)


@pytest.fixture
def ann_client(ann) -> Client:
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def test_the_agent_page_link_chooses_that_agent(ann, kb, config, ann_client):
    save_config(ann, kb, name="Another config")
    agent = agent_services.save_agent(actor=ann, workspace=kb.workspace, name="helper", template="tool_calling",
                                      settings={"model": SMOLLM2})
    agent_page = ann_client.get(f"/agents/{agent.pk}/").content.decode()
    link = re.search(r'href="([^"]+)">Publish as an app<', agent_page)[1].replace("&amp;", "&")

    apps_page = ann_client.get(link).content.decode()

    assert chosen_source(apps_page) == [f"agent:{agent.pk}"]
    published = ann_client.post("/apps/", {"source": chosen_source(apps_page)[0], "slug": "helper-app"}, follow=True)
    assert "Published &#x27;helper&#x27;" in published.content.decode()


def test_the_config_page_link_chooses_that_config(ann, kb, config, ann_client):
    other = save_config(ann, kb, name="Another config")
    config_page = ann_client.get(f"/rag/configs/{config.pk}/").content.decode()
    link = re.search(r'href="([^"]+)">Publish as an app<', config_page)[1]

    assert chosen_source(ann_client.get(link).content.decode()) == [f"config:{config.pk}"]
    assert chosen_source(ann_client.get(f"/apps/?config={other.pk}").content.decode()) == [f"config:{other.pk}"]
    assert chosen_source(ann_client.get("/apps/?agent=nope").content.decode()) == []
