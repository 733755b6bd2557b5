"""What in RAG Studio uses a deployment or a model, for serving to name when it refuses to delete one."""

from django.utils.translation import gettext as _

from rag_studio.models import KnowledgeBase, RagConfig
from serving.models import Deployment, Model
from serving.services import deployment_users, model_users


@deployment_users.registering("rag_studio")
def _uses_of_deployment(deployment: Deployment) -> list[str]:
    bases = KnowledgeBase.objects.filter(embedding_deployment=deployment).values_list("name", flat=True)
    configs = RagConfig.objects.filter(model=deployment.name).values_list("name", flat=True)
    return ([_("knowledge base '%(name)s'") % {"name": name} for name in bases]
            + [_("RAG config '%(name)s'") % {"name": name} for name in configs])


@model_users.registering("rag_studio")
def _uses_of_model(model: Model) -> list[str]:
    bases = KnowledgeBase.objects.filter(embedding_model=model).values_list("name", flat=True)
    configs = RagConfig.objects.filter(model=model.name).values_list("name", flat=True)
    return ([_("knowledge base '%(name)s'") % {"name": name} for name in bases]
            + [_("RAG config '%(name)s'") % {"name": name} for name in configs])
