"""The demo agent that ships with the platform: a word-counting assistant with one sandboxed Work Bridge tool, and its
scenarios. `bench.agent_eval` scores it on SmolLM2-135M; the GUI's "Create the demo agent" makes it in a workspace."""

from accounts.models import Workspace
from accounts.services import Actor
from agent_studio import services
from agent_studio.models import Agent, Scenario
from workbridge import services as workbridge
from workbridge.models import Tool

TOOL_NAME = "word_count"
TOOL_CODE = "def run(args):\n    return {'words': len(args['text'].split())}\n"
AGENT_NAME = "word-counter"
SCENARIOS = [
    {"name": "counts four words", "input": "How many words are in 'apples bananas cherries dates'? Use the "
                                           "word_count tool.",
     "checks": [{"kind": "contains", "value": "4"}], "expected_tools": [{"name": TOOL_NAME}]},
    {"name": "counts three words", "input": "Count the words in 'red green blue'.",
     "checks": [{"kind": "contains", "value": "3"}], "expected_tools": [{"name": TOOL_NAME}]},
    {"name": "counts a pangram", "input": "How many words does 'the quick brown fox jumps over the lazy dog' have?",
     "checks": [{"kind": "contains", "value": "9"}], "expected_tools": [{"name": TOOL_NAME,
                                                                          "arguments": {"text": "the quick brown fox "
                                                                                                "jumps over the lazy "
                                                                                                "dog"}}]},
    {"name": "answers without a tool", "input": "What is the capital of France?",
     "checks": [{"kind": "contains", "value": "Paris"}], "forbidden_tools": [TOOL_NAME]},
]


def create_demo_agent(*, actor: Actor, workspace: Workspace, model: str) -> Agent:
    """The demo agent, its tool and scenarios in the workspace (made again if they are already there)."""
    tool = Tool.objects.filter(workspace=workspace, name=TOOL_NAME).first()
    tool = workbridge.save_tool(
        actor=actor, workspace=workspace, tool=tool, name=TOOL_NAME, binding="python", config={"code": TOOL_CODE},
        description="Count the words of a text.",
        parameters={"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}})
    agent = services.save_agent(
        actor=actor, workspace=workspace, agent=Agent.objects.filter(workspace=workspace, name=AGENT_NAME).first(),
        name=AGENT_NAME, template="tool_calling", description="Counts the words of a text with a sandboxed tool.",
        settings={"model": model, "tools": [tool.pk], "generation": {"temperature": 0.0},
                  "system_prompt": "You count words with the word_count tool and answer with the number."})
    for scenario in SCENARIOS:
        services.save_scenario(actor=actor, agent=agent, scenario=Scenario.objects.filter(
            agent=agent, name=scenario["name"]).first(), **scenario)
    return agent
