"""After an install: does the platform answer, ingest a document and serve a chat? Run on the appliance, by root:

    /opt/ai-factory/current/.venv/bin/python /opt/ai-factory/current/appliance/smoke.py --prefix /opt/ai-factory

It makes an API key for the first admin (named smoke-<time>, revoke it when done), creates a knowledge base,
uploads a short document, waits until it is indexed and retrievable, and asks the preset chat model a question
through the OpenAI-compatible gateway. Prints each step's time; exits non-zero at the first step that fails.
"""

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

# Run as a script with the release's venv, which does not install the release's own code.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from appliance import env_file  # noqa: E402

DOCUMENT = ("# Press line 3\n\nThe hydraulic press on line 3 is greased every 200 operating hours with NLGI-2 grease.\n"
            "Error E77 means the hydraulic pressure fell below 180 bar: check the pump filter.\n")
CHAT_MODEL = "smollm2-135m-instruct"


def _request(url: str, key: str, method: str = "GET", body: bytes | None = None, content_type: str = "",
             timeout: float = 300) -> dict:
    request = urllib.request.Request(url, data=body, method=method, headers={"Authorization": f"Bearer {key}"})
    if content_type:
        request.add_header("Content-Type", content_type)
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def _api_key(prefix: Path) -> str:
    """A workspace key of the first admin, made by the platform's own code as the services' user."""
    code = ("from django.contrib.auth import get_user_model; from accounts import services; "
            "from accounts.services import Actor; import time; "
            "admin = get_user_model().objects.filter(is_superuser=True).order_by('pk').first(); "
            "workspace = admin.memberships.order_by('pk').first().workspace; "
            "print(services.create_api_key(actor=Actor(user=admin), workspace=workspace, "
            "name=f'smoke-{int(time.time())}').secret)")
    owner = (prefix / "data").stat()
    done = subprocess.run([str(prefix / "current" / ".venv" / "bin" / "python"), "manage.py", "shell", "-c", code],
                          cwd=prefix / "current", env={"PATH": "/usr/bin:/bin", **env_file.read(prefix / "env")},
                          capture_output=True, text=True, user=owner.st_uid, group=owner.st_gid, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"could not make an API key: {done.stderr[-1500:]}")
    return done.stdout.strip().splitlines()[-1]


def _multipart(name: str, content: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            f"Content-Type: text/markdown\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=Path, default=Path("/opt/ai-factory"))
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for ingestion and the model")
    args = parser.parse_args()
    url = env_file.read(args.prefix / "env").get("FACTORY_URL", "http://127.0.0.1:8000").rstrip("/")
    started = time.monotonic()

    def step(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {line}", flush=True)

    key = _api_key(args.prefix)
    step("API key made")
    kb = _request(f"{url}/api/rag/knowledge-bases/", key, "POST", json.dumps({"name": f"smoke-{int(time.time())}"})
                  .encode(), "application/json")
    body, content_type = _multipart("press-line-3.md", DOCUMENT.encode())
    _request(f"{url}/api/rag/knowledge-bases/{kb['id']}/documents/", key, "POST", body, content_type)
    step(f"document uploaded to knowledge base {kb['id']}")
    deadline = time.monotonic() + args.timeout
    while True:
        documents = _request(f"{url}/api/rag/knowledge-bases/{kb['id']}/documents/", key)
        if documents and all(document["status"] == "indexed" for document in documents):
            break
        if any(document["status"] == "failed" for document in documents) or time.monotonic() > deadline:
            raise SystemExit(f"the document was not indexed: {documents}")
        time.sleep(2)
    step("document indexed")
    hits = _request(f"{url}/api/rag/knowledge-bases/{kb['id']}/hit-test/", key, "POST",
                    json.dumps({"query": "What does error E77 mean?"}).encode(), "application/json")
    if "180 bar" not in json.dumps(hits):
        raise SystemExit(f"retrieval did not find the document: {json.dumps(hits)[:1000]}")
    step("retrieval finds it")
    question = {"model": CHAT_MODEL, "max_tokens": 32,
                "messages": [{"role": "user", "content": "Say hello to the plant in one sentence."}]}
    while True:
        try:
            answer = _request(f"{url}/v1/chat/completions", key, "POST", json.dumps(question).encode(),
                              "application/json")
            break
        except urllib.error.HTTPError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"the chat was not answered: {exc.code} {exc.read()[:500]!r}")
            time.sleep(5)  # the model's replica is still starting
    text = answer["choices"][0]["message"]["content"]
    if not text.strip():
        raise SystemExit(f"the chat answer was empty: {answer}")
    step(f"chat answered: {text.strip()[:120]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
