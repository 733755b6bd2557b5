import pytest
from django.conf import settings
from django.core.cache import cache

from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from rag_studio import services as rag_services
from runtime import services
from serving.presets import SMOLLM2
from serving.services import create_deployment
from tests.rag_studio.conftest import acme, ann, indexed_kb, presets  # noqa: F401  (fixtures shared with RAG Studio)


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    cache.clear()


@pytest.fixture
def smollm2(presets):  # noqa: F811
    """The chat deployment configs name; created, not started, for tests that never reach the model."""
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    return create_deployment(actor=SYSTEM, workspace=None, model=presets[SMOLLM2], name=SMOLLM2,
                             replicas=[(node, 1.0)])


@pytest.fixture
def kb(acme, ann):  # noqa: F811
    return rag_services.create_knowledge_base(actor=ann, workspace=acme, name="Handbook docs")


def save_config(actor, kb, name: str = "Handbook", **settings):
    return rag_services.save_rag_config(actor=actor, workspace=kb.workspace, name=name, knowledge_base=kb,
                                        template="citations", model=SMOLLM2, **{"generation": {"max_tokens": 32},
                                                                               **settings})


@pytest.fixture
def config(ann, kb, smollm2):  # noqa: F811
    return save_config(ann, kb)


@pytest.fixture
def app(ann, config):  # noqa: F811
    return services.publish_app(actor=ann, config=config, slug="handbook")


@pytest.fixture
def app_key(ann, app):  # noqa: F811
    return services.create_app_key(actor=ann, app=app, name="intranet").secret
