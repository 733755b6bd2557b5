"""Knowledge bases still on the platform's default retrieval settings move to the new default, whose weighted
fusion takes z-scores among each side's candidates (rag_studio/search/fusion.py); settings a user chose stay."""

from django.db import migrations

# The default before and after, copied: a migration must not change with the code.
RERANK = {"kind": "none", "model": "", "top_k": 5, "threshold": 0.0}
OLD_DEFAULT = {"mode": "hybrid", "top_k": 5, "candidates": 30, "fusion": "weighted", "normalisation": "zscore",
               "dense_weight": 0.5, "keyword_weight": 0.5, "rrf_k": 60, "max_per_document": 0, "score_threshold": 0.0,
               "rerank": RERANK}
NEW_DEFAULT = {**OLD_DEFAULT, "normalisation": "zscore_candidates"}


def forwards(apps, schema_editor):
    move(apps, OLD_DEFAULT, NEW_DEFAULT)


def backwards(apps, schema_editor):
    move(apps, NEW_DEFAULT, OLD_DEFAULT)


def move(apps, before: dict, after: dict) -> None:
    KnowledgeBase = apps.get_model("rag_studio", "KnowledgeBase")
    for kb in KnowledgeBase.objects.only("pk", "retrieval"):
        if kb.retrieval == before:
            KnowledgeBase.objects.filter(pk=kb.pk).update(retrieval=after)


class Migration(migrations.Migration):
    dependencies = [("rag_studio", "0009_eval_item_hidden_chunks")]

    operations = [migrations.RunPython(forwards, backwards)]
