"""RAG templates as LangChain runnables, built from a config version's stored settings.

A pipeline is two steps: `retrieve` (question and history → the queries it searched and the hits) and the
`answer` runnable (prompt → chat model through the gateway). They are kept apart, not piped into one, so that
callers can show the cited chunks before the first token and stream the answer after them. Retrieval is plain
calls rather than a runnable: LangChain's per-invoke bookkeeping cost a third of its CPU, for no callbacks.
"""

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import cached_property

from asgiref.sync import sync_to_async
from langchain_core.messages import HumanMessage
from langchain_core.prompts import ChatPromptTemplate

from rag_studio.gateway_client import chat_model
from rag_studio.models import KnowledgeBase, RagTemplate
from rag_studio.search.fusion import reciprocal_rank_scores
from rag_studio.search.retrieval import Hit, retrieve
from rag_studio.selectors import text_language

DEFAULT_PROMPTS = {
    RagTemplate.BASIC: (
        "Answer the question using only the context below. If the context does not contain the answer, say that "
        "you don't know.\n\nContext:\n{context}\n\nQuestion: {question}"),
    RagTemplate.CITATIONS: (
        "Answer the question using only the numbered passages below. After each sentence, cite the passage it "
        "comes from as [n]. If the passages do not contain the answer, say that you don't know.\n\n"
        "Passages:\n{context}\n\nQuestion: {question}"),
}
# A knowledge base whose text is mostly Chinese is answered from Chinese instructions: a small model otherwise
# answers in English, or repeats the English instructions to a Chinese user.
CHINESE_PROMPTS = {
    RagTemplate.BASIC: (
        "请只根据下面的上下文回答问题。如果上下文中没有答案，就回答不知道。\n\n上下文：\n{context}\n\n问题：{question}"),
    RagTemplate.CITATIONS: (
        "请只根据下面编号的段落回答问题，每句话后用 [n] 标出它出自哪一段。如果段落中没有答案，就回答不知道。\n\n"
        "段落：\n{context}\n\n问题：{question}"),
}
for prompts in (DEFAULT_PROMPTS, CHINESE_PROMPTS):
    prompts[RagTemplate.CONVERSATIONAL] = prompts[RagTemplate.CITATIONS]
    prompts[RagTemplate.MULTI_QUERY] = prompts[RagTemplate.CITATIONS]
# The conversational and multi-query templates' own steps, in the question's language (by answers_in_chinese).
REWRITE_PROMPTS = {
    False: ("Rewrite the last question as a standalone question that can be understood without the conversation. "
            "Reply with the question only.\n\nConversation:\n{history}\n\nLast question: {question}\n\n"
            "Standalone question:"),
    True: ("把最后一个问题改写成不看对话也能读懂的独立问题。只回复问题本身。\n\n对话：\n{history}\n\n"
           "最后一个问题：{question}\n\n独立问题："),
}
MULTI_QUERY_PROMPTS = {
    False: ("Write {count} different search queries that would find information to answer the question. One per "
            "line, no numbering.\n\nQuestion: {question}\n\nQueries:"),
    True: ("写出 {count} 个不同的搜索查询，用来查找回答这个问题所需的信息。每行一个，不要编号。\n\n"
           "问题：{question}\n\n查询："),
}
MULTI_QUERY_COUNT = 3
CITATION = re.compile(r"\[(\d{1,2})\]")


@dataclass
class RagResult:
    question: str
    queries: list[str]
    hits: list[Hit]
    answer: str = ""
    usage: dict = field(default_factory=dict)
    timings_ms: dict = field(default_factory=dict)

    def citations(self) -> list[dict]:
        """The passages the answer cites as [n], in order of first citation; with no [n] in the answer (basic
        template, or a model that ignored the instruction), every retrieved passage counts as a source."""
        cited = []
        for number in CITATION.findall(self.answer):
            n = int(number)
            if 1 <= n <= len(self.hits) and n not in cited:
                cited.append(n)
        numbers = cited or range(1, len(self.hits) + 1)
        return [citation(n, self.hits[n - 1], cited=bool(cited)) for n in numbers]


def citation(n: int, hit: Hit, *, cited: bool) -> dict:
    return {"n": n, "chunk_id": hit.chunk_id, "document": hit.filename, "document_id": hit.document_id,
            "page": hit.page, "heading": hit.heading, "score": hit.rerank if hit.rerank is not None else hit.fused,
            "text": hit.text, "cited": cited}


def format_context(hits: list[Hit]) -> str:
    return "\n\n".join(f"[{n}] ({hit.filename}) {hit.text}" for n, hit in enumerate(hits, start=1))


def _history_text(history: list[dict]) -> str:
    return "\n".join(f"{turn['role']}: {turn['content']}" for turn in history[-6:])


def _rrf(lists: list[list[Hit]], top_k: int) -> list[Hit]:
    """Fuse the hit lists of several queries by reciprocal rank; a chunk keeps its best-scored copy."""
    scores = reciprocal_rank_scores([hit.chunk_id for hit in hits] for hits in lists)
    best = {}
    for hits in lists:
        for hit in hits:
            if hit.chunk_id not in best or hit.fused > best[hit.chunk_id].fused:
                best[hit.chunk_id] = hit
    order = sorted(scores, key=lambda chunk_id: (-scores[chunk_id], chunk_id))[:top_k]
    fused = [best[chunk_id] for chunk_id in order]
    for rank, hit in enumerate(fused, start=1):
        hit.rank = rank
    return fused


class RagPipeline:
    def __init__(self, kb: KnowledgeBase, settings: dict):
        self.kb, self.settings = kb, settings
        self.chinese = not settings.get("prompt") and kb.language == "zh"
        self._answers: dict[bool, object] = {}

    # The prompt and chat models are built on first use: retrieval alone (hit testing, an app's /retrieve) needs
    # none of them.
    @cached_property
    def prompt(self) -> ChatPromptTemplate:
        return self._prompt(self.chinese)

    def _prompt(self, chinese: bool) -> ChatPromptTemplate:
        default = (CHINESE_PROMPTS if chinese else DEFAULT_PROMPTS)[self.settings["template"]]
        return ChatPromptTemplate.from_messages([("human", self.settings.get("prompt") or default)])

    @property
    def default_prompt(self) -> str:
        """The template's instructions in the language most of the knowledge base is written in."""
        return (CHINESE_PROMPTS if self.chinese else DEFAULT_PROMPTS)[self.settings["template"]]

    def answers_in_chinese(self, question: str) -> bool:
        """Whether the template's instructions for `question` are the Chinese ones: a question in Chinese is
        answered in Chinese whatever the documents' language (a Chinese user otherwise gets English from an English
        handbook), one in English in English; a question of neither follows the knowledge base."""
        asked = text_language([question])
        return asked == "zh" if asked else self.chinese

    def answer(self, question: str):
        """The prompt → chat model runnable for `question`'s language (built once per language)."""
        chinese = self.answers_in_chinese(question) and not self.settings.get("prompt")
        if chinese not in self._answers:
            generation = self.settings.get("generation") or {}
            self._answers[chinese] = self._prompt(chinese) | chat_model(
                self.kb.workspace_id, self.settings["model"], temperature=generation.get("temperature", 0.2),
                max_tokens=generation.get("max_tokens", 256))
        return self._answers[chinese]

    @cached_property
    def helper_llm(self):
        return chat_model(self.kb.workspace_id, self.settings["model"], temperature=0, max_tokens=96)

    def _queries(self, question: str, history: list[dict]) -> list[str]:
        template = self.settings["template"]
        queries = [question]
        if template == RagTemplate.CONVERSATIONAL and history:
            rewritten = self._ask(REWRITE_PROMPTS[self.answers_in_chinese(question)].format(
                history=_history_text(history), question=question))
            queries = [rewritten.splitlines()[0] if rewritten else question]
        elif template == RagTemplate.MULTI_QUERY:
            reply = self._ask(MULTI_QUERY_PROMPTS[self.answers_in_chinese(question)].format(
                count=MULTI_QUERY_COUNT, question=question))
            rewrites = [line.strip(" -*0123456789.").strip() for line in reply.splitlines()]
            queries += [q for q in rewrites if q and q.lower() != question.lower()][:MULTI_QUERY_COUNT]
        return queries

    def _ask(self, text: str) -> str:
        return str(self.helper_llm.invoke([HumanMessage(text)]).content).strip()

    def _search(self, queries: list[str]) -> list[Hit]:
        overrides = self.settings.get("retrieval") or {}
        results = [retrieve(self.kb, query, overrides) for query in queries]
        top_k = results[0].settings["rerank"]["top_k"] if results[0].settings["rerank"]["kind"] != "none" else \
            results[0].settings["top_k"]
        return results[0].hits if len(results) == 1 else _rrf([r.hits for r in results], top_k)

    def _prompt_inputs(self, question: str, hits: list[Hit]) -> dict:
        return {"question": question, "context": format_context(hits) or "(no passages found)"}

    def retrieve(self, question: str, history: list[dict] | None = None) -> RagResult:
        started = time.perf_counter()
        queries = self._queries(question, history or [])
        return RagResult(question=question, queries=queries, hits=self._search(queries),
                         timings_ms={"retrieval": round((time.perf_counter() - started) * 1000, 2)})

    def run(self, question: str, history: list[dict] | None = None) -> RagResult:
        result = self.retrieve(question, history)
        started = time.perf_counter()
        message = self.answer(question).invoke(self._prompt_inputs(question, result.hits))
        result.answer = str(message.content)
        result.usage = dict(message.usage_metadata or {})
        result.timings_ms["generation"] = round((time.perf_counter() - started) * 1000, 2)
        return result

    async def astream(self, question: str, history: list[dict] | None = None) -> AsyncIterator[tuple[str, object]]:
        result = await sync_to_async(self.retrieve, thread_sensitive=False)(question, history)
        yield "hits", result
        started, parts = time.perf_counter(), []
        async for chunk in self.answer(result.question).astream(self._prompt_inputs(result.question, result.hits)):
            if chunk.content:
                if not parts:
                    result.timings_ms["ttft"] = round((time.perf_counter() - started) * 1000, 2)
                parts.append(str(chunk.content))
                yield "token", str(chunk.content)
            if chunk.usage_metadata:
                result.usage = dict(chunk.usage_metadata)
        result.answer = "".join(parts)
        result.timings_ms["generation"] = round((time.perf_counter() - started) * 1000, 2)
        yield "done", result


