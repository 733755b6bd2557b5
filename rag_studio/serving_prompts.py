"""RAG eval sets offered to serving's calibration of model groups (serving/groups/sources.py): each question with
its expected answer as a prompt and its reference."""

from django.utils.translation import gettext_lazy as _

from rag_studio.models import EvalSet, JobStatus
from serving.groups.sources import PromptSource, register_prompt_source


def _sets(*, workspace) -> list[tuple[int, str]]:
    return list(EvalSet.objects.filter(workspace=workspace, status=JobStatus.DONE).values_list("pk", "name"))


def _items(*, workspace, set_id: int) -> list[dict] | None:
    eval_set = EvalSet.objects.filter(workspace=workspace, pk=set_id, status=JobStatus.DONE).first()
    if eval_set is None:
        return None
    return [{"prompt": item.question, "reference": item.expected_answer} for item in eval_set.items.all()]


register_prompt_source(PromptSource(key="rag-eval-set", label=_("RAG eval set"), sets=_sets, items=_items))
