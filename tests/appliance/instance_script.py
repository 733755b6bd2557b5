"""Run inside a release's tree (cwd) with its own python, on FACTORY_DATA_DIR: `seed` makes an instance as a user
would (a knowledge base with documents, a published app with a key, a workspace API key, a tool's secret) and prints
the keys; `probe KEYS QUERIES` asks it what a user would notice. Written against the APIs that the previous release
and this one share, as it runs on both."""

import io
import json
import os
import sys

sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402

SAMPLES = "rag_studio/samples"
DOCUMENTS = ["northwind-support-faq.md"]
NOTE = ("# Line 3 maintenance\n\nThe press on line 3 is greased every 200 operating hours with grease NLGI-2.\n"
        "Error E77 on the press means the hydraulic pressure fell below 180 bar; check the pump filter.\n")


def seed() -> dict:
    from accounts.services import Actor, create_api_key, create_workspace
    from rag_studio import services
    from rag_studio.pipeline.ingestion import ingest
    from rag_studio.pipeline.storage import UploadedFile
    from runtime.services import create_app_key, publish_app
    from serving import presets
    from serving.models import Deployment, Model
    from workbridge.services import set_secret

    call_command("migrate", verbosity=0, interactive=False)
    # Gemma's preset is copied into the data dir (250 MB); the instance needs the embedding and a chat model only.
    presets.PRESETS = {name: preset for name, preset in presets.PRESETS.items() if name != presets.GEMMA3}
    presets.register_presets(lambda line: None)
    owner = Actor(user=get_user_model().objects.create_user(username="ops", password="x" * 12, is_staff=True))
    workspace = create_workspace(actor=owner, name="Plant")
    kb = services.create_knowledge_base(actor=owner, workspace=workspace, name="Northwind")
    uploads = [(name, open(os.path.join(SAMPLES, name), "rb").read()) for name in DOCUMENTS]
    uploads.append(("line-3-maintenance.md", NOTE.encode()))
    outcomes = services.upload_documents(actor=owner, kb=kb, uploads=[
        UploadedFile(name, io.BytesIO(content), len(content)) for name, content in uploads])
    for outcome in outcomes:
        assert ingest(outcome.document.pk, "upgrade-test") == "indexed"
    Deployment.objects.create(workspace=None, name="smollm2-135m-instruct", engine="llamacpp",
                              model=Model.objects.get(name="smollm2-135m-instruct"))
    config = services.save_rag_config(actor=owner, workspace=workspace, name="Plant QA", knowledge_base=kb,
                                      template="citations", model="smollm2-135m-instruct",
                                      prompt="Answer from {context}: {question}")
    app = publish_app(actor=owner, config=config, slug="plant-qa")
    set_secret(actor=owner, workspace=workspace, name="ERP_TOKEN", value="erp-token-7f3a")
    return {"app_slug": app.slug, "app_key": create_app_key(actor=owner, app=app, name="mes").secret,
            "api_key": create_api_key(actor=owner, workspace=workspace, name="ops-key").secret}


def probe(keys: dict, queries: list[str]) -> dict:
    from workbridge.models import Secret

    client = Client(HTTP_HOST="127.0.0.1")
    hits = {}
    for query in queries:
        answer = client.post(f"/api/apps/{keys['app_slug']}/retrieve", {"query": query},
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {keys['app_key']}")
        assert answer.status_code == 200, answer.content
        hits[query] = answer.json()["hits"]
    listed = client.get("/api/rag/knowledge-bases/", HTTP_AUTHORIZATION=f"Bearer {keys['api_key']}")
    assert listed.status_code == 200, listed.content
    body = listed.json()
    return {"hits": hits, "knowledge_bases": sorted(kb["name"] for kb in body.get("results", body)),
            "secret": Secret.objects.get(name="ERP_TOKEN").value}


if __name__ == "__main__":
    if sys.argv[1] == "seed":
        result = seed()
    else:
        result = probe(json.loads(sys.argv[2]), json.loads(sys.argv[3]))
    print("RESULT " + json.dumps(result, sort_keys=True))
