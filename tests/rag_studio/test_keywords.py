"""Keyword tokens for Chinese as good as English (issue 34): traditional characters fold to simplified, English
words are stemmed alike in English and in mixed Chinese text, and a knowledge base's domain terms are kept whole
(tokenizer_for); the terms are a knowledge base setting the API takes, checks and stores."""

import threading

import pytest
from django.test import Client

from rag_studio import services
from rag_studio.models import KnowledgeBase
from rag_studio.search.keywords import (
    PREVIOUS_TOKENS_VERSION,
    TOKENS_VERSION,
    KeywordTokenizer,
    keyword_tokens,
    previous_keyword_tokens,
    tokenizer_for,
)


def test_traditional_chinese_gives_the_tokens_of_simplified():
    assert keyword_tokens("資料庫連線逾時，請檢查網路設定") == keyword_tokens("资料库连线逾时，请检查网路设定")
    assert "资料库" in keyword_tokens("資料庫")


def test_english_words_are_stemmed_alike_alone_and_among_chinese():
    # A question in mixed text matches the document's inflected forms, which a plain lower-case would not.
    document = keyword_tokens("The scheduler restarts failed Pods and logs the Connections it retried.")
    question = keyword_tokens("如何让调度器restart失败的pod并查看connection日志")
    shared = set(document) & set(question)
    assert {"restart", "pod", "connect"} <= shared
    # Identifiers stay whole and unstemmed besides their parts.
    assert keyword_tokens("kube-proxy 的 iptables 规则")[:4] == ["kube", "proxi", "kube-proxy", "iptabl"]


def test_domain_terms_are_emitted_whole_wherever_they_occur():
    tokenizer = KeywordTokenizer(["数据湖仓", "Kube-Proxy", "API gateway", "數據湖倉"])
    assert tokenizer.domain_terms == ["数据湖仓", "kube-proxy", "api gateway"]  # folded, each once
    tokens = tokenizer("新的數據湖倉架构用 kube-proxy 和 API  Gateway，不是 rapid api")
    assert tokens.count("数据湖仓") == 1 and tokens.count("kube-proxy") == 2  # the compound and the term
    assert tokens.count("api_gateway") == 1  # spaces inside a term match any run of spaces
    # Without the terms the whole phrase is no token: jieba cuts it into shorter words.
    assert "数据湖仓" not in keyword_tokens("新的数据湖仓架构") and "api_gateway" not in keyword_tokens("API gateway")
    # An English term is a word of its own, not part of a longer one.
    assert "api_gateway" not in KeywordTokenizer(["api gateway"])("rapi gateway")


def test_a_knowledge_base_gets_its_own_tokenizer():
    with_terms = KnowledgeBase(keyword_terms=["数据湖仓"])
    assert "数据湖仓" in tokenizer_for(with_terms)("数据湖仓的元数据")
    assert tokenizer_for(KnowledgeBase(keyword_terms=["数据湖仓"])) is tokenizer_for(with_terms)  # built once
    assert tokenizer_for(KnowledgeBase(keyword_terms=[])) is keyword_tokens


def test_tokens_are_the_same_from_many_threads_at_once():
    texts = [f"Connections {n} 連線 restarted pods 数据湖仓 v1.{n}" for n in range(200)]
    expected = [keyword_tokens(text) for text in texts]
    tokenizer = KeywordTokenizer(["数据湖仓"])
    expected_terms = [tokenizer(text) for text in texts]
    results, failures = {}, []

    def tokenize(worker: int) -> None:
        try:
            results[worker] = ([keyword_tokens(text) for text in texts], [tokenizer(text) for text in texts])
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=tokenize, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert all(result == (expected, expected_terms) for result in results.values())


@pytest.mark.django_db
def test_domain_terms_through_the_api(acme, key_client, presets):
    client = key_client("ann", acme)
    created = client.post("/api/rag/knowledge-bases/", {
        "name": "湖仓", "keyword_terms": ["數據湖倉", " 数据湖仓 ", "kube-proxy", ""]}, format="json")
    assert created.status_code == 201, created.json()
    kb = created.json()
    assert kb["keyword_terms"] == ["數據湖倉", "kube-proxy"]  # the user's spelling, duplicates after folding once
    assert not kb["needs_reindex"]

    changed = client.patch(f"/api/rag/knowledge-bases/{kb['id']}/", {"keyword_terms": ["数据湖仓", "ETL 作业"]},
                           format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["keyword_terms"] == ["数据湖仓", "ETL 作业"]
    # The index holds the old terms' tokens until it is rebuilt, and the knowledge base says so.
    assert changed.json()["needs_reindex"]
    assert KnowledgeBase.objects.get(pk=kb["id"]).keyword_terms == ["数据湖仓", "ETL 作业"]

    for bad, problem in (("数据湖仓", "must be a list of strings"), ([1, 2], "must be a list of strings"),
                         (["x" * 65], "longer than 64 characters")):
        response = client.patch(f"/api/rag/knowledge-bases/{kb['id']}/", {"keyword_terms": bad}, format="json")
        assert response.status_code == 400, response.json()
        assert problem in str(response.json()) and "keyword_terms" in str(response.json())


@pytest.mark.django_db
def test_domain_terms_on_the_knowledge_base_page(acme, ann, presets):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="湖仓")
    page = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    page.force_login(ann.user)
    form = {"name": kb.name, "description": "", "embedding_model": kb.embedding_model.name,
            "keyword_terms": "数据湖仓\r\nkube-proxy\r\n"}
    assert page.post(f"/rag/kb/{kb.pk}/settings/", form).status_code == 302
    kb.refresh_from_db()
    assert kb.keyword_terms == ["数据湖仓", "kube-proxy"]
    html = page.get(f"/rag/kb/{kb.pk}/").content.decode()
    assert "领域术语" in html and ">数据湖仓\nkube-proxy</textarea>" in html


def test_an_index_built_before_stemming_keeps_its_tokens_until_it_is_rebuilt():
    """An upgraded instance's live index was tokenised the previous way: its queries are too, so no result changes
    until the user rebuilds it, and the rebuild gets today's tokens."""
    kb = KnowledgeBase(indexed_with={"keyword_tokens": PREVIOUS_TOKENS_VERSION}, index_key="old",
                       building_key="new", building_with={"keyword_tokens": TOKENS_VERSION})

    live, rebuilt = tokenizer_for(kb), tokenizer_for(kb, "new")

    assert live is previous_keyword_tokens and tokenizer_for(kb, "old") is previous_keyword_tokens
    assert live("Connections 資料庫")[0] == "connections" and "资料库" not in live("資料庫")
    assert rebuilt is keyword_tokens and "connect" in rebuilt("Connections") and "资料库" in rebuilt("資料庫")
