from django.db.models import Count, QuerySet

from agent_studio import config
from agent_studio.models import Agent, AgentEvalRun, AgentRun, AgentTemplate, AgentThread, RunStep, Scenario
from agent_studio.tracing import step_payload


def agents(*, workspace) -> QuerySet[Agent]:
    return Agent.objects.filter(workspace=workspace)


def agents_with_counts(*, workspace) -> QuerySet[Agent]:
    return agents(workspace=workspace).annotate(run_count=Count("runs", distinct=True))


def runs(*, workspace) -> QuerySet[AgentRun]:
    return AgentRun.objects.filter(workspace=workspace).select_related("agent", "version", "thread")


def threads(*, workspace) -> QuerySet[AgentThread]:
    return AgentThread.objects.filter(agent__workspace=workspace).select_related("agent")


def scenarios(*, workspace) -> QuerySet[Scenario]:
    return Scenario.objects.filter(agent__workspace=workspace).select_related("agent")


def eval_runs(*, workspace) -> QuerySet[AgentEvalRun]:
    return AgentEvalRun.objects.filter(agent__workspace=workspace).select_related("agent", "version")


def run_steps(run: AgentRun) -> list[dict]:
    return [step_payload(step) for step in RunStep.objects.filter(run=run)]


def thread_variables(thread: AgentThread) -> dict:
    """Each defined variable of the thread's agent, with its scope, description and value in this thread."""
    from agent_studio.memory import variable_values

    definitions = thread.agent.settings.get("variables", [])
    values = variable_values(definitions=definitions, thread=thread)
    return {"thread_id": str(thread.public_id), "end_user": thread.end_user,
            "variables": [definition | {"value": values.get(definition["name"])} for definition in definitions]}


def templates() -> list[dict]:
    """Every agent template: what it does and each setting it takes, with its default (the same in every
    workspace; the system prompt's in the reader's language)."""
    listed, defaults = [], config.defaults()
    for template in AgentTemplate:
        description, names, required = config.TEMPLATES[template]
        listed.append({"template": template.value, "label": str(template.label), "description": description,
                       "settings": [{"name": name, "type": config.SETTINGS[name][0], "required": name in required,
                                     "default": defaults.get(name), "description": config.SETTINGS[name][1]}
                                    for name in names]})
    return listed
