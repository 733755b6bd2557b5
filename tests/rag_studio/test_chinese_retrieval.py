"""A Chinese knowledge base answers Chinese questions, and awkward input gets an answer, never an error (issue 20):
one-character queries, full-width digits, traditional characters, mixed Chinese and English, Big5 and GB18030 files."""

import json

import pytest
from django.test import Client

from accounts.errors import ValidationFailed
from accounts.models import Workspace
from accounts.services import Actor
from rag_studio import services
from rag_studio.models import Document, KnowledgeBase
from rag_studio.pipeline.ingestion import ingest
from rag_studio.pipeline.parsing import parse_document
from rag_studio.rag import CHINESE_PROMPTS, DEFAULT_PROMPTS, RagPipeline
from rag_studio.search.retrieval import retrieve
from rag_studio.search.retrieval_config import is_default
from serving import presets
from tests.conftest import tasks_to_unread_queue
from tests.rag_studio.conftest import SAMPLES, ingested_kb, upload

# A test that adds documents or switches the embedding model takes `own_plant_kb`: files on disk do not roll back.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("shared_northwind", "shared_plant_kb")]
CHINESE_SAMPLES = ["huadong-plant-handbook.md", "huadong-maintenance-rules.docx", "huadong-shift-handover.txt"]


def _ingest_plant(ann, workspace, name: str):
    # The English-only model chosen on purpose: these tests show what retrieval and the page do with it.
    return ingested_kb(ann, workspace, name, CHINESE_SAMPLES, embedding_model=presets.MINILM,
                       chunking={"mode": "heading", "chunk_size": 240, "chunk_overlap": 40})


@pytest.fixture(scope="module")
def shared_plant_kb(shared_northwind, django_db_blocker) -> int:
    """The Chinese samples ingested once for the module, beside `shared_northwind` (emptied with it)."""
    with django_db_blocker.unblock(), tasks_to_unread_queue():
        workspace = Workspace.objects.get(pk=shared_northwind["workspace"])
        return _ingest_plant(Actor(user=workspace.memberships.get(role="owner").user), workspace, "一号装置").pk


@pytest.fixture
def plant_kb(db, shared_plant_kb):
    return KnowledgeBase.objects.get(pk=shared_plant_kb)


@pytest.fixture
def own_plant_kb(acme, ann):
    return _ingest_plant(ann, acme, "二号装置")


def top_texts(kb, query: str, **settings) -> list[str]:
    return [hit.text for hit in retrieve(kb, query, {"top_k": 3} | settings).hits]


def test_paraphrased_chinese_questions_find_their_passage(plant_kb):
    assert any("立即停止进料" in text for text in top_texts(plant_kb, "反应釜压力到多少必须马上停止进料？"))
    assert any("整定压力为零点五五兆帕" in text for text in top_texts(plant_kb, "安全阀设定在什么压力起跳"))
    assert any("提前三十分钟到岗" in text for text in top_texts(plant_kb, "接班的人要提前多久到？"))


def test_the_gb18030_text_file_is_read_and_its_chinese_headings_become_the_chunks_headings(plant_kb):
    document = plant_kb.documents.get(filename="huadong-shift-handover.txt")
    headings = set(document.chunks.values_list("heading", flat=True))

    assert {"第一章 总则", "第二章 交接班要求", "第三章 记录与考核"} <= headings


def test_awkward_queries_are_answered_without_an_error(plant_kb):
    for query in ["釜", "？", "８００１", "反應釜壓力", "R-101 reactor 的压力", "P-402B", "的"]:
        for mode in ["dense", "keyword", "hybrid"]:
            assert isinstance(retrieve(plant_kb, query, {"mode": mode, "top_k": 5}).hits, list), (query, mode)
    # Nothing but an ideographic space is no query at all: refused with the reason, as an empty one is.
    with pytest.raises(ValidationFailed, match="The query is empty."):
        retrieve(plant_kb, "\u3000", {"mode": "hybrid"})
    # Traditional characters match no keyword token of simplified text; hybrid search still answers (its dense half).
    assert retrieve(plant_kb, "反應釜壓力", {"mode": "hybrid", "top_k": 5}).hits


def test_full_width_digits_and_one_character_queries_find_what_they_name(plant_kb):
    assert any("8001" in text for text in top_texts(plant_kb, "８００１", mode="keyword"))
    assert any("釜" in text for text in top_texts(plant_kb, "釜", mode="keyword"))
    assert any("P-402B" in text for text in top_texts(plant_kb, "Ｐ－４０２Ｂ", mode="keyword"))


def test_big5_and_gb18030_files_of_traditional_and_simplified_text_are_decoded(tmp_path):
    traditional = ("第一章 總則\n設備檢修前必須執行上鎖掛牌，切斷電源後在配電櫃上鎖，"
                   "並掛「有人作業，禁止合閘」標識牌。") * 3
    simplified = "第一章 总则\n设备检修前必须执行上锁挂牌，切断电源后在配电柜上锁，并挂“有人作业，禁止合闸”标识牌。" * 3
    big5, gb18030 = tmp_path / "big5.txt", tmp_path / "gb.txt"
    big5.write_bytes(traditional.encode("big5"))
    gb18030.write_bytes(simplified.encode("gb18030"))

    assert parse_document(big5, "rules.txt")[0].text.replace("\r", "") == traditional
    assert parse_document(gb18030, "rules.txt")[0].text.replace("\r", "") == simplified


def chinese_client(ann):
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-CN")
    client.force_login(ann.user)
    return client


def test_a_mostly_chinese_knowledge_base_is_offered_the_multilingual_embedding_model(own_plant_kb, indexed_kb, ann):
    client = chinese_client(ann)
    assert "用 multilingual-e5-small 重建索引" in client.get(f"/rag/kb/{own_plant_kb.pk}/").content.decode()
    assert "multilingual-e5-small 重建索引" not in client.get(f"/rag/kb/{indexed_kb.pk}/").content.decode()

    client.post(f"/rag/kb/{own_plant_kb.pk}/settings/", {"action": "multilingual_embedding"})

    own_plant_kb.refresh_from_db()
    assert own_plant_kb.embedding_model.name == presets.MULTILINGUAL_E5 and own_plant_kb.building_key
    assert 'id="multilingual-embedding"' not in client.get(f"/rag/kb/{own_plant_kb.pk}/").content.decode()


def test_ingestion_records_the_language_and_the_page_explains_the_defaults_until_the_user_sets_their_own(
        own_plant_kb, indexed_kb, ann):
    assert (own_plant_kb.language, indexed_kb.language) == ("zh", "en")
    assert is_default(own_plant_kb.retrieval) and own_plant_kb.retrieval["normalisation"] == "zscore_candidates"
    client = chinese_client(ann)
    page = client.get(f"/rag/kb/{own_plant_kb.pk}/").content.decode()
    assert 'id="retrieval-defaults"' in page and "z 分数融合" in page

    # Settings of the user's own are theirs: more documents leave them alone, and the page no longer explains them.
    services.update_knowledge_base(actor=ann, kb=own_plant_kb,
                                   retrieval={**own_plant_kb.retrieval, "dense_weight": 0.8, "keyword_weight": 0.2})
    outcome, = services.upload_documents(actor=ann, kb=own_plant_kb,
                                         uploads=[upload("班组.txt", "班组长负责交接班记录。".encode())])
    assert ingest(outcome.document.pk, "pytest") == "indexed"
    own_plant_kb.refresh_from_db()
    assert own_plant_kb.retrieval["dense_weight"] == 0.8
    assert 'id="retrieval-defaults"' not in client.get(f"/rag/kb/{own_plant_kb.pk}/").content.decode()


def test_the_chinese_gui_offers_the_multilingual_model_and_every_new_base_starts_on_the_same_defaults(acme, ann):
    chinese, english = chinese_client(ann), Client(HTTP_ACCEPT_LANGUAGE="en")
    english.force_login(ann.user)
    assert f'<option value="{presets.MULTILINGUAL_E5}" selected>' in chinese.get("/rag/").content.decode()
    assert f'<option value="{presets.MULTILINGUAL_E5}" selected>' not in english.get("/rag/").content.decode()

    chinese.post("/rag/", {"name": "巡检记录", "chunk_mode": "recursive", "embedding_model": presets.MINILM})
    chinese.post("/rag/", {"name": "交接班", "chunk_mode": "recursive", "embedding_model": presets.MULTILINGUAL_E5})
    english.post("/rag/", {"name": "Shift logs", "chunk_mode": "recursive", "embedding_model": presets.MINILM})

    # One default serves English and Chinese text (measured on the shipped samples: see retrieval_config).
    assert {kb.name: is_default(kb.retrieval) for kb in KnowledgeBase.objects.filter(
        name__in=["巡检记录", "交接班", "Shift logs"])} == {
        "巡检记录": True, "交接班": True, "Shift logs": True}


def test_the_multilingual_embedding_preset_finds_chinese_passages_by_meaning(acme, ann):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="一号装置（多语言向量）",
                                        embedding_model=presets.MULTILINGUAL_E5,
                                        chunking={"mode": "recursive", "chunk_size": 240, "chunk_overlap": 40})
    outcomes = services.upload_documents(actor=ann, kb=kb, uploads=[
        upload(name, (SAMPLES / name).read_bytes()) for name in CHINESE_SAMPLES])
    for outcome in outcomes:
        assert ingest(outcome.document.pk, "pytest") == "indexed", Document.objects.get(pk=outcome.document.pk).error
    questions = [json.loads(line) for line in (SAMPLES / "huadong-eval.jsonl").read_text().splitlines()]

    found = [question for question in questions
             if any(question["evidence"] in text
                    for text in top_texts(kb, question["question"], mode="dense", top_k=5))]

    assert kb.embedding_dimensions == 384
    assert len(found) >= 0.9 * len(questions)


def test_a_chinese_knowledge_base_is_answered_from_chinese_instructions(plant_kb, indexed_kb):
    chinese = RagPipeline(plant_kb, {"template": "citations"})
    english = RagPipeline(indexed_kb, {"template": "citations"})
    own = RagPipeline(plant_kb, {"template": "citations", "prompt": "Answer {question} from {context}"})

    assert chinese.prompt.format(context="[1] 储罐", question="怎么办？").count("请只根据下面编号的段落回答问题") == 1
    assert chinese.default_prompt == CHINESE_PROMPTS["citations"]
    assert english.default_prompt == DEFAULT_PROMPTS["citations"]
    assert own.prompt.format(context="c", question="q") == "Human: Answer q from c"
