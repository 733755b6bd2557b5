"""Issue 48: a RAG assistant answers a Chinese question from Chinese instructions even when its documents are
English, and an English question from English ones; its conversational step asks in the question's language too.
A prompt the user wrote is used as written."""

import pytest

from rag_studio import services
from rag_studio.rag import CHINESE_PROMPTS, DEFAULT_PROMPTS, RagPipeline
from serving.presets import SMOLLM2 as MODEL

pytestmark = pytest.mark.django_db


@pytest.fixture
def faq_kb(acme, ann):
    return services.create_knowledge_base(actor=ann, workspace=acme, name="FAQ")


def test_a_chinese_question_is_answered_from_chinese_instructions_whatever_the_documents(faq_kb):
    faq_kb.language = "en"
    pipeline = RagPipeline(faq_kb, {"template": "citations", "model": MODEL})
    own = RagPipeline(faq_kb, {"template": "citations", "model": MODEL, "prompt": "Answer {question} from {context}"})

    assert pipeline.answers_in_chinese("退货需要多少天？") and not pipeline.answers_in_chinese("How many days?")
    chinese = pipeline.answer("退货需要多少天？").first.format(context="[1] 三十天", question="退货需要多少天？")
    english = pipeline.answer("How many days?").first.format(context="[1] 30 days", question="How many days?")
    assert CHINESE_PROMPTS["citations"].split("\n")[0] in chinese and DEFAULT_PROMPTS["citations"][:40] in english
    # A prompt the user wrote is theirs, whatever the question's language.
    assert own.answer("退货？").first.format(context="c", question="退货？") == "Human: Answer 退货？ from c"
    # The conversational template's rewrite step is asked in the question's language too.
    asked = []
    conversational = RagPipeline(faq_kb, {"template": "conversational", "model": MODEL})
    conversational._ask = lambda text: asked.append(text) or "退货期限是多久？"
    history = [{"role": "user", "content": "运费多少？"}, {"role": "assistant", "content": "免运费。"}]
    assert conversational._queries("那退货呢？", history) == ["退货期限是多久？"]
    assert asked[0].startswith("把最后一个问题改写成")
