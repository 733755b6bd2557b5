"""Published apps in signed bundles: the app's settings travel with a RAG config bundle of the version it serves
(a workflow app's with its workflow and the assets it uses: runtime/workflow_bundles.py), and importing one
publishes the app again in the target workspace, in the same all-or-nothing transaction."""

from django.db.models import Q

from accounts.errors import ValidationFailed
from accounts.models import Workspace
from accounts.services import Actor
from assets.bundles import Bundle, ImportOutcome, bundle_importer
from assets.models import Asset, AssetKind
from rag_studio.bundles import APP_BUNDLE, ExportedBundle, export_config_bundle, import_verified_bundle
from rag_studio.models import RagConfig
from runtime import services
from runtime.models import App
from runtime.workflow_bundles import export_workflow_app_bundle


def export_app_bundle(*, actor: Actor, app: App, include_indexes: bool = False) -> ExportedBundle:
    """The app's served config version with its knowledge base (optionally its index), and the app's settings.
    Keys, traces and the web chat token stay behind: they belong to this instance."""
    if app.is_workflow:
        return export_workflow_app_bundle(actor=actor, app=app, extra=_app_settings(app))
    if app.is_agent:
        raise ValidationFailed("Bundles carry RAG apps for now; an agent app's agent, tools and knowledge bases "
                               "cannot be exported yet.")
    services.register_app_asset(app, actor=actor)
    return export_config_bundle(
        actor=actor, config=app.rag_config, version_number=app.current_release.config_version.number,
        include_indexes=include_indexes, extra=_app_settings(app))


def _app_settings(app: App) -> dict:
    return {"name": app.name, "slug": app.slug, "default_rate_limit": app.default_rate_limit,
            "allowed_origins": app.allowed_origins, "opener": app.opener,
            "suggested_questions": app.suggested_questions}


def _free_slug(slug: str) -> str:
    candidate, counter = slug, 1
    while App.objects.filter(slug=candidate).exists():
        counter += 1
        candidate = f"{slug[:58]}-{counter}"
    return candidate


def _publisher(actor: Actor, published: list[App]):
    def publish(config: RagConfig, extra: dict | None) -> None:
        if not isinstance(extra, dict) or not isinstance(extra.get("slug"), str) or not isinstance(
                extra.get("name"), str):
            raise ValidationFailed("The bundle's app section needs a name and a slug.")
        app = services.publish_app(actor=actor, config=config, name=extra["name"],
                                   slug=_free_slug(extra["slug"]), rate_limit=extra.get("default_rate_limit", 60))
        # Bundles from before openers carry none.
        services.update_app(actor=actor, app=app, allowed_origins=extra.get("allowed_origins") or [],
                            opener=extra.get("opener") or "",
                            suggested_questions=extra.get("suggested_questions") or [])
        published.append(app)

    return publish


@bundle_importer(APP_BUNDLE)
def import_app_bundle(*, actor: Actor, workspace: Workspace, bundle: Bundle) -> ImportOutcome:
    published: list[App] = []
    result = import_verified_bundle(actor=actor, workspace=workspace, bundle=bundle,
                                    on_extra=_publisher(actor, published))
    app = published[0]
    imported = Asset.objects.filter(Q(kind=AssetKind.KNOWLEDGE_BASE, ref_id=str(result.kb.pk))
                                    | Q(kind=AssetKind.RAG_CONFIG, ref_id=str(result.config.pk))
                                    | Q(kind=AssetKind.APP, ref_id=str(app.pk)), workspace=workspace)
    notes = [*result.notes, f"Published as /api/apps/{app.slug}/; create an app key on its page to call it."]
    return ImportOutcome(assets=list(imported), notes=notes)
