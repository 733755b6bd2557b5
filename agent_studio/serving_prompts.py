"""An agent's scenarios offered to serving's calibration of model groups (serving/groups/sources.py): each
scenario's input as a prompt, and the text its "contains" checks expect as the reference (a scenario without one
has no reference, and calibration refuses the set naming it)."""

from django.utils.translation import gettext_lazy as _

from agent_studio.models import Agent, Scenario
from serving.groups.sources import PromptSource, register_prompt_source


def _sets(*, workspace) -> list[tuple[int, str]]:
    return list(Agent.objects.filter(workspace=workspace).values_list("pk", "name"))


def _reference(scenario: Scenario) -> str:
    return " ".join(str(check.get("value") or "") for check in scenario.checks
                    if isinstance(check, dict) and check.get("kind") == "contains").strip()


def _items(*, workspace, set_id: int) -> list[dict] | None:
    agent = Agent.objects.filter(workspace=workspace, pk=set_id).first()
    if agent is None:
        return None
    return [{"prompt": scenario.input, "reference": _reference(scenario)} for scenario in agent.scenarios.all()]


register_prompt_source(PromptSource(key="agent-scenarios", label=_("agent's scenarios"), sets=_sets, items=_items))
