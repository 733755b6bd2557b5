"""The names of the models that ship with the platform, and what forms make of them: read by selectors and page
templates, which sit below the presets' registration (serving/presets.py builds on services)."""

SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
MINILM = "all-minilm-l6-v2"
# Suggested for knowledge bases whose documents are mostly Chinese (rag_studio's views).
MULTILINGUAL_E5 = "multilingual-e5-small"
DEPLOYED_AT_SETUP = (SMOLLM2, GEMMA3)
# Gemma-3-270M is a base model: the chat template below lets it take chat requests, but it continues the text rather
# than answering it. Forms label it "completion only" and preselect an instruction-tuned model instead.
COMPLETION_ONLY = frozenset({GEMMA3})
RECOMMENDED_CHAT = SMOLLM2
# The presets as one name, big and small behind it (serving/groups/).
PRESET_GROUP = "gemma-smollm2"
