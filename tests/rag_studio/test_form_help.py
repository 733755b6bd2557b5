"""Jargon comes with its explanation: the retrieval settings beyond mode, fusion and depth sit in an "Advanced" fold,
"candidates" says what it is, and the knowledge base form shows only the chunking fields of its mode."""

import re

import pytest
from django.test import Client

from rag_studio import services as rag_services
from tests.rag_studio.conftest import acme, ann, presets  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(ann) -> Client:  # noqa: F811
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def label_of(page: str, field: str) -> str:
    """The label around the field, up to the field: where its explanation (title) and name are."""
    at = page.index(f'name="{field}"')
    return page[page.rindex("<label", 0, at):at]


@pytest.mark.parametrize("mode, shown, hidden", [
    ("recursive", ["chunk_size"], ["parent_size", "delimiter"]),
    ("parent_child", ["parent_size"], ["chunk_size", "delimiter"]),
    ("delimiter", ["chunk_size", "delimiter"], ["parent_size"]),
])
def test_the_knowledge_base_form_shows_the_fields_of_its_chunking_mode(ann, acme, client, mode, shown, hidden):  # noqa: F811
    chunking = {"mode": mode, **({"delimiter": "##"} if mode == "delimiter" else {})}
    kb = rag_services.create_knowledge_base(actor=ann, workspace=acme, name="Docs", chunking=chunking)
    page = client.get(f"/rag/kb/{kb.pk}/").content.decode()

    def field_hidden(name: str) -> bool:
        # The row (or label) holding the field carries `hidden` when its mode does not use it.
        before = page[:page.index(f'name="{name}"')]
        holder = before[before.rindex("data-chunk-modes"):]
        return re.match(r'data-chunk-modes="[^"]*" hidden', holder) is not None

    assert [field_hidden(name) for name in shown] == [False] * len(shown)
    assert [field_hidden(name) for name in hidden] == [True] * len(hidden)


def test_the_retrieval_settings_fold_away_their_jargon_with_explanations(ann, acme, client):  # noqa: F811
    kb = rag_services.create_knowledge_base(actor=ann, workspace=acme, name="Docs")
    page = client.get(f"/rag/kb/{kb.pk}/").content.decode()

    fold = page[page.index('<details class="advanced">'):page.index("</details>")]
    for field in ("dense_weight", "normalisation", "rrf_k", "rerank_kind"):
        assert f'name="{field}"' in fold
    assert 'name="top_k"' not in fold and 'name="mode"' not in fold
    assert "before they are fused" in label_of(page, "candidates")
    assert "z-score" in label_of(page, "normalisation")
    assert "1 / (k + rank)" in label_of(page, "rrf_k")
