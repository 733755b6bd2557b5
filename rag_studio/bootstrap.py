from accounts.bootstrap import bootstrap_step


@bootstrap_step(order=40)
def registered_assets(say) -> None:
    """Knowledge bases and RAG configs made before the asset registry existed get their entry; registering
    unchanged content again writes nothing."""
    from rag_studio.models import KnowledgeBase, RagConfig
    from rag_studio.services import register_config_asset, register_kb_asset

    for kb in KnowledgeBase.objects.select_related("workspace", "embedding_model"):
        register_kb_asset(kb)
    for config in RagConfig.objects.select_related("workspace", "knowledge_base").filter(versions__isnull=False) \
            .distinct():
        register_config_asset(config)
