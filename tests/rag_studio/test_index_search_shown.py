"""The knowledge base page and API say whether dense search runs exactly or on an approximate (IVF) index."""

import numpy as np
from django.test import Client

from rag_studio import services
from rag_studio.search.stores import store_for


def write_chunks(kb, first_id: int, count: int) -> None:
    vectors = np.random.default_rng(first_id).standard_normal((count, kb.embedding_dimensions))
    store_for(kb).apply(upserts={str(first_id): (list(range(first_id, first_id + count)), vectors,
                                                 [f"chunk {i}" for i in range(count)])})


def test_the_page_and_api_say_how_the_index_is_searched(acme, ann, key_client, settings):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Scale")
    api = key_client("ann", acme)
    english, chinese = Client(HTTP_ACCEPT_LANGUAGE="en"), Client(HTTP_ACCEPT_LANGUAGE="zh-CN")
    for page in (english, chinese):
        page.force_login(ann.user)

    write_chunks(kb, 1, 40)
    assert api.get(f"/api/rag/knowledge-bases/{kb.pk}/").json()["index_search"] == "exact"
    assert 'data-method="exact">exact search<' in english.get(f"/rag/kb/{kb.pk}/").content.decode()
    assert "精确检索" in chinese.get(f"/rag/kb/{kb.pk}/").content.decode()

    settings.RAG_INDEX_ANN_THRESHOLD = 100  # a segment this large gets an IVF index
    write_chunks(kb, 1000, 120)
    assert api.get(f"/api/rag/knowledge-bases/{kb.pk}/").json()["index_search"] == "ivf"
    assert "approximate search (IVF)" in english.get(f"/rag/kb/{kb.pk}/").content.decode()
    assert "近似检索（IVF）" in chinese.get(f"/rag/kb/{kb.pk}/").content.decode()
