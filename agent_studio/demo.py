"""The demo agent that ships with the platform: a word-counting assistant with one sandboxed Work Bridge tool, and its
scenarios. `bench.agent_eval` scores it on SmolLM2-135M; the GUI's "Create the demo agent" makes it in a workspace."""

from django.utils.translation import get_language

from accounts.models import Workspace
from accounts.services import Actor
from agent_studio import services
from agent_studio.models import Agent, Scenario
from workbridge import services as workbridge
from workbridge.models import Tool

TOOL_NAME = "word_count"
TOOL_CODE = "def run(args):\n    return {'words': len(args['text'].split())}\n"
AGENT_NAME = "word-counter"
PANGRAM = "the quick brown fox jumps over the lazy dog"
# What the demo says and is scored on, in the language of whoever makes it: the English and the Chinese side by side
# (the texts counted stay English words: word_count splits on spaces).
TEXTS = {
    "en": {
        "description": "Counts the words of a text with a sandboxed tool.",
        "tool_description": "Count the words of a text.",
        "system_prompt": "You count words with the word_count tool and answer with the number.",
        "scenarios": [
            {"name": "counts four words", "input": "How many words are in 'apples bananas cherries dates'? Use the "
                                                   "word_count tool.",
             "checks": [{"kind": "contains", "value": "4"}], "expected_tools": [{"name": TOOL_NAME}]},
            {"name": "counts three words", "input": "Count the words in 'red green blue'.",
             "checks": [{"kind": "contains", "value": "3"}], "expected_tools": [{"name": TOOL_NAME}]},
            {"name": "counts a pangram", "input": f"How many words does '{PANGRAM}' have?",
             "checks": [{"kind": "contains", "value": "9"}],
             "expected_tools": [{"name": TOOL_NAME, "arguments": {"text": PANGRAM}}]},
            {"name": "answers without a tool", "input": "What is the capital of France?",
             "checks": [{"kind": "contains", "value": "Paris"}], "forbidden_tools": [TOOL_NAME]},
        ],
    },
    "zh-hans": {
        "description": "用沙箱中的工具统计一段文字的词数。",
        "tool_description": "统计一段文字的词数（按空格分词）。",
        "system_prompt": "你用 word_count 工具统计词数，并用简体中文回答这个数字。",
        "scenarios": [
            {"name": "统计四个词", "input": "'apples bananas cherries dates' 里有几个词？请使用 word_count 工具。",
             "checks": [{"kind": "contains", "value": "4"}], "expected_tools": [{"name": TOOL_NAME}]},
            {"name": "统计三个词", "input": "数一数 'red green blue' 里的词。",
             "checks": [{"kind": "contains", "value": "3"}], "expected_tools": [{"name": TOOL_NAME}]},
            {"name": "统计一句全字母句", "input": f"'{PANGRAM}' 有几个词？",
             "checks": [{"kind": "contains", "value": "9"}],
             "expected_tools": [{"name": TOOL_NAME, "arguments": {"text": PANGRAM}}]},
            {"name": "不用工具回答", "input": "法国的首都是哪里？",
             "checks": [{"kind": "regex", "value": "巴黎|Paris"}], "forbidden_tools": [TOOL_NAME]},
        ],
    },
}


def texts() -> dict:
    """The demo's texts in the active language (the user's)."""
    return TEXTS["zh-hans" if (get_language() or "").lower().startswith("zh") else "en"]


def create_demo_agent(*, actor: Actor, workspace: Workspace, model: str) -> Agent:
    """The demo agent, its tool and scenarios in the workspace (made again if they are already there), in the
    active language."""
    said = texts()
    tool = Tool.objects.filter(workspace=workspace, name=TOOL_NAME).first()
    tool = workbridge.save_tool(
        actor=actor, workspace=workspace, tool=tool, name=TOOL_NAME, binding="python", config={"code": TOOL_CODE},
        description=said["tool_description"],
        parameters={"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}})
    agent = services.save_agent(
        actor=actor, workspace=workspace, agent=Agent.objects.filter(workspace=workspace, name=AGENT_NAME).first(),
        name=AGENT_NAME, template="tool_calling", description=said["description"],
        settings={"model": model, "tools": [tool.pk], "generation": {"temperature": 0.0},
                  "system_prompt": said["system_prompt"]})
    for scenario in said["scenarios"]:
        services.save_scenario(actor=actor, agent=agent, scenario=Scenario.objects.filter(
            agent=agent, name=scenario["name"]).first(), **scenario)
    return agent
