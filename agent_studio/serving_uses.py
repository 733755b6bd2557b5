"""Which agents use a deployment (or a model group's name) as their model, for serving to name when it refuses to
delete the deployment."""

from django.utils.translation import gettext as _

from agent_studio.models import Agent
from serving.models import Deployment
from serving.services import deployment_users


@deployment_users.registering("agent_studio")
def _agents_using(deployment: Deployment) -> list[str]:
    names = Agent.objects.filter(settings__model=deployment.name).values_list("name", flat=True)
    return [_("agent '%(name)s'") % {"name": name} for name in names]
