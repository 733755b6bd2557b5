"""Which embedding model reads a knowledge base's text. A base created without a model waits for its first
documents: just before the first embedding, their language decides (the English-only default, or the multilingual
preset for Chinese or mixed text). A model the user chose is never replaced; a mismatch is reported instead.

The choice is made once per knowledge base, under its row lock, so that workers embedding two of its documents at
once agree on one model: the first decides, the others read its decision."""

import re
import secrets
from dataclasses import dataclass

from django.db import transaction

from rag_studio import selectors
from rag_studio.embedding import check_local_model
from rag_studio.models import Document, DocumentStatus, EmbeddingModelSource, KnowledgeBase, Stage
from serving.models import Model, RoleHint
from serving.preset_names import MINILM, MULTILINGUAL_E5
from serving.selectors import models_visible_to

# Share of Chinese text (selectors.chinese_share) from which a base counts as mixed: below it, Chinese is an
# occasional name or quote; from it, enough questions will be asked in Chinese to need a model that reads it.
MIXED_CHINESE_SHARE = 0.15
# Enough chunks to tell the language, few enough to read in one query under the lock.
SAMPLE_CHUNKS = 200
# Names that say a model reads Chinese, and those of English-only models; other models are not judged.
_READS_CHINESE = ("multilingual", "bge-m3", "-zh", "chinese", "m3e", "text2vec", "labse")
_ENGLISH_ONLY = re.compile(rf"^({re.escape(MINILM)}|all-minilm|all-mpnet)|(^|[-_/])en([-_.]|$)")


def reads_chinese(model_name: str) -> bool | None:
    name = model_name.lower()
    if any(marker in name for marker in _READS_CHINESE):
        return True
    return False if _ENGLISH_ONLY.search(name) else None


def language_of_share(share: float | None) -> str:
    if share is None:
        return ""
    if share >= selectors.MOSTLY_CHINESE_SHARE:
        return "zh"
    return "mixed" if share >= MIXED_CHINESE_SHARE else "en"


def _multilingual_model(kb: KnowledgeBase) -> Model | None:
    return models_visible_to(workspace=kb.workspace).filter(name=MULTILINGUAL_E5,
                                                           role_hint=RoleHint.EMBEDDING).first()


def choose_before_embedding(kb_id: int) -> KnowledgeBase:
    """Called before a knowledge base's documents are embedded; returns the knowledge base as it is now (with the
    model to embed with). The first call reads its chunks' language; where no model was chosen, it picks one."""
    kb = KnowledgeBase.objects.select_related("embedding_model", "embedding_deployment").get(pk=kb_id)
    if kb.embedding_model_evidence:
        return kb
    with transaction.atomic():
        kb = KnowledgeBase.objects.select_for_update().select_related("embedding_model").get(pk=kb_id)
        if kb.embedding_model_evidence:  # another worker decided while this one waited for the lock
            return KnowledgeBase.objects.select_related("embedding_model", "embedding_deployment").get(pk=kb_id)
        texts = kb.chunks.filter(searchable=True).order_by("pk").values_list("text", flat=True)[:SAMPLE_CHUNKS]
        share = selectors.chinese_share(texts)
        if share is None:
            return kb
        evidence = {"language": language_of_share(share), "chinese_share": round(share, 3),
                    "model": kb.embedding_model.name}
        fields = ["embedding_model_evidence", "updated_at"]
        if kb.embedding_model_source == EmbeddingModelSource.PENDING and not _embedded_any(kb):
            better = _multilingual_model(kb) if evidence["language"] in ("zh", "mixed") else None
            if better is not None and better.pk != kb.embedding_model_id:
                _switch_model(kb, better)
                fields += ["embedding_model", "embedding_deployment", "embedding_dimensions", "index_key",
                           "indexed_with", "building_with"]
            evidence["unavailable"] = evidence["language"] in ("zh", "mixed") and better is None
            kb.embedding_model_source = EmbeddingModelSource.DETECTED
            fields.append("embedding_model_source")
        kb.embedding_model_evidence = evidence
        kb.save(update_fields=fields)
    return KnowledgeBase.objects.select_related("embedding_model", "embedding_deployment").get(pk=kb_id)


def _embedded_any(kb: KnowledgeBase) -> bool:
    return Document.objects.filter(knowledge_base=kb).filter(
        status=DocumentStatus.INDEXED).exists() or Document.objects.filter(
        knowledge_base=kb, stage__in=[Stage.INDEX, Stage.DONE]).exists()


def _switch_model(kb: KnowledgeBase, model: Model) -> None:
    """Nothing is embedded yet, so the index starts afresh under a key naming the new model."""
    kb.embedding_model, kb.embedding_deployment = model, None
    kb.embedding_dimensions = model.embedding_dimensions or check_local_model(model.path)
    kb.index_key = f"{model.name[:40]}.{secrets.token_hex(4)}.v1"
    if kb.building_key:
        kb.building_with = selectors.index_settings(kb)
    kb.indexed_with = selectors.index_settings(kb)


@dataclass(frozen=True)
class EmbeddingFit:
    """Why the knowledge base has its embedding model, and whether the model reads its text."""

    reason: str
    mismatch: str  # "" when the model suits the text (or nothing is known yet)
    suggested: str  # a model that would read the text better, where one is registered


_LANGUAGE_WORDS = {"zh": "Chinese", "mixed": "a mix of Chinese and English", "en": "English"}


def embedding_fit(kb: KnowledgeBase) -> EmbeddingFit:
    """In English, for the API (the GUI words its own from the same fields)."""
    model, evidence = kb.embedding_model.name, kb.embedding_model_evidence or {}
    if kb.embedding_model_source == EmbeddingModelSource.PENDING:
        reason = (f"No model was chosen, so it is picked from the language of the first documents, before they are "
                  f"embedded: {MULTILINGUAL_E5} for Chinese or mixed text, {model} for English.")
    elif kb.embedding_model_source == EmbeddingModelSource.DETECTED:
        language = _LANGUAGE_WORDS.get(evidence.get("language"), "unknown")
        share = f"{evidence.get('chinese_share', 0):.0%} Chinese"
        if evidence.get("model") != model:
            reason = (f"Picked automatically: the first documents are {language} ({share}), and the default "
                      f"{evidence.get('model')} reads English only; {model} reads Chinese and English.")
        elif evidence.get("unavailable"):
            reason = (f"The first documents are {language} ({share}), but {MULTILINGUAL_E5} is not registered "
                      f"here, so the default {model} was kept.")
        else:
            reason = f"Picked automatically: the first documents are {language} ({share}), which {model} reads."
    else:
        reason = "Chosen by the user; never changed automatically."
    language = kb.language if kb.language in ("zh", "en") else ""
    if evidence.get("language") == "mixed" and language != "zh":
        language = "mixed"
    language = language or evidence.get("language", "")
    mismatch = suggested = ""
    if language in ("zh", "mixed") and reads_chinese(model) is False:
        available = _multilingual_model(kb)
        suggested = available.name if available else ""
        advice = (f" Re-index with {suggested} (set embedding_model with reindex=true)." if suggested
                  else " Register a multilingual embedding model and re-index with it.")
        mismatch = (f"The text is {_LANGUAGE_WORDS[language]}, but {model} reads English only: dense search finds "
                    f"few Chinese passages.{advice}")
    return EmbeddingFit(reason=reason, mismatch=mismatch, suggested=suggested)
