"""Settings, read from the environment so that one codebase runs as the appliance and as a cluster.

FACTORY_ENV            dev (default) or prod; prod requires a long secret key and ALLOWED_HOSTS, turns DEBUG off and
                       HTTPS-only cookies, HSTS and the HTTPS redirect on (`manage.py check --deploy` is clean)
FACTORY_SECRET_KEY     required in prod (50 characters or more); otherwise made once in the data dir
FACTORY_DATA_DIR       files, indexes, the SQLite database and engine logs (default ./data)
DATABASE_URL           Postgres in a cluster (default: SQLite in the data dir, WAL mode)
REDIS_URL              Celery broker, result backend and cache (default redis://127.0.0.1:6379/0)
FACTORY_NODE_NAME      this machine's name in the GPU pool; its worker listens on queue node.<name>
FACTORY_GATEWAY_URL    where workers reach the OpenAI-compatible gateway (default http://127.0.0.1:$FACTORY_PORT/v1)
FACTORY_RAG_*          ingestion limits and tuning, below
FACTORY_TRUSTED_BUNDLE_KEYS  other instances' public keys (base64, comma-separated) whose signed bundles are accepted
FACTORY_BUNDLE_MAX_BYTES     the most data one imported bundle may unpack to (default 4 GiB)
FACTORY_EGRESS_ALLOW   hosts and networks (with an optional :port or :port-port) every workspace's tools may reach
                       though they are not public; only an entry naming a port opens the platform's own ports
FACTORY_MCP_COMMANDS   the operator's catalogue of local (stdio) MCP commands workspaces may use, a TOML file
                       (default <data dir>/mcp-commands.toml; README "Local MCP commands")
FACTORY_MCP_POOL_SIZE, FACTORY_MCP_POOL_IDLE_S  open MCP sessions each process keeps, and how long one stays unused
                       (16, 300 s)
FACTORY_WORKSPACE_CREATION  staff (default) or anyone: who may create workspaces
FACTORY_RAG_ADAPTIVE_DEFAULTS  on (default) or off: whether knowledge bases fit their default retrieval to their text
FACTORY_RAG_INDEX_BACKEND  embedded (default) or pgvector: where new knowledge bases keep their indexes
FACTORY_RAG_PGVECTOR_URL   the Postgres database of the pgvector backend (default: DATABASE_URL)
FACTORY_RAG_UPLOADS_DIR    uploaded documents on storage shared by the ingesting nodes (default: in the data dir)
FACTORY_MCP_ALLOWED_HOSTS    the names /mcp answers to (default: loopback, FACTORY_HOST, ALLOWED_HOSTS)
FACTORY_SANDBOX        bwrap (default) or unsafe-dev: how python tools are isolated
FACTORY_SANDBOX_MEMORY_MB, FACTORY_SANDBOX_PROCESSES  each python tool run's memory and process limits (512, 32)
FACTORY_ALLOWED_HOSTS  the Host names the web server answers to (required in prod; loopback and the platform's own
                       names in dev)
FACTORY_PUBLIC_URL     the address people and browsers reach the platform at (the web chat's own origin)
FACTORY_MODEL_DIRS     the only directories models may be registered from by path (platform administrators)
FACTORY_NODE_ADDRESS   the address this node's engine replicas listen on, reached by the gateway and health checks
FACTORY_METRICS_TOKEN  the bearer token Prometheus sends to /metrics (staff sessions need none)
FACTORY_*_RATE         rate limits, below
"""

import os
import secrets
import socket
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from accounts import redis_connections
from accounts.atomic_files import made_once
from cluster import cpu_budget
from enhancement.training import LOGGERS_QUIET_ON_CPU

# Before torch is first imported by any process of the platform (and inherited by the engines it starts): OpenMP
# threads that sleep when idle instead of spinning. On a small CPU, torch's spinning threads (query embedding)
# and numpy's BLAS threads (dense search) otherwise take turns stealing each other's cores: hybrid retrieval p95
# at 100k chunks went from 146 ms to 52 ms on 2 cores (bench.retrieve).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

BASE_DIR = Path(__file__).resolve().parent.parent
FACTORY_ENV = os.environ.get("FACTORY_ENV", "dev")
PRODUCTION = FACTORY_ENV == "prod"
DATA_DIR = Path(os.environ.get("FACTORY_DATA_DIR", BASE_DIR / "data")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)
MIN_SECRET_KEY_LENGTH = 50


def _generated_secret_key() -> str:
    """A random key made on first run and kept in the data dir (mode 0600), so that no installation signs sessions
    and service tokens with a key anyone can read in the repository. Every process of one installation shares the
    data dir, and so the key; nodes elsewhere are given FACTORY_SECRET_KEY."""
    return made_once(DATA_DIR / "secret_key", lambda: secrets.token_urlsafe(48).encode()).decode().strip()


SECRET_KEY = os.environ.get("FACTORY_SECRET_KEY", "")
if PRODUCTION and (len(SECRET_KEY) < MIN_SECRET_KEY_LENGTH or len(set(SECRET_KEY)) < 5):
    raise ImproperlyConfigured(f"FACTORY_SECRET_KEY must be set to a private random value of at least "
                               f"{MIN_SECRET_KEY_LENGTH} characters when FACTORY_ENV=prod (for example: python -c "
                               f"'import secrets; print(secrets.token_urlsafe(48))').")
SECRET_KEY = SECRET_KEY or _generated_secret_key()
DEBUG = not PRODUCTION and os.environ.get("FACTORY_DEBUG", "0") == "1"
WEB_HOST = os.environ.get("FACTORY_HOST", "127.0.0.1")
WEB_PORT = os.environ.get("FACTORY_PORT", "8000")
# Where people and browsers reach the platform; the web chat's own origin is computed from it, never from a
# request's Host header.
PUBLIC_URL = (os.environ.get("FACTORY_PUBLIC_URL")
              or f"http://{WEB_HOST if WEB_HOST != '0.0.0.0' else '127.0.0.1'}:{WEB_PORT}")
GATEWAY_URL = os.environ.get("FACTORY_GATEWAY_URL") or f"http://127.0.0.1:{WEB_PORT}/v1"
if PRODUCTION and not os.environ.get("FACTORY_ALLOWED_HOSTS", "").strip(" ,*"):
    raise ImproperlyConfigured("FACTORY_ALLOWED_HOSTS must name the hosts this server answers to (comma-separated) "
                               "when FACTORY_ENV=prod.")
# In dev: loopback and the names the platform itself is reached by (its web host, public URL and gateway URL).
ALLOWED_HOSTS = [host.strip() for host in os.environ.get("FACTORY_ALLOWED_HOSTS", "").split(",") if host.strip()] or [
    *dict.fromkeys(host for host in ("127.0.0.1", "localhost", "[::1]", WEB_HOST, urlsplit(PUBLIC_URL).hostname,
                                     urlsplit(GATEWAY_URL).hostname) if host and host != "0.0.0.0")]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("FACTORY_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

if PRODUCTION:
    # HTTPS only (a TLS-terminating proxy in front sets X-Forwarded-Proto, trusted with FACTORY_BEHIND_PROXY=1).
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = os.environ.get("FACTORY_SSL_REDIRECT", "1") == "1"
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SECURE_HSTS_SECONDS = int(os.environ.get("FACTORY_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    if os.environ.get("FACTORY_BEHIND_PROXY", "0") == "1":
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

NODE_NAME = os.environ.get("FACTORY_NODE_NAME") or socket.gethostname().split(".")[0].lower()
# Where this node's engine replicas listen and the gateway and health checks reach them: loopback on one box, the
# node's own address in a pool (each replica also requires its own key).
NODE_ADDRESS = os.environ.get("FACTORY_NODE_ADDRESS", "127.0.0.1")
# The only directories models may be registered from by path (a platform administrator's action).
MODEL_DIRS = [Path(entry.strip()) for entry in os.environ.get("FACTORY_MODEL_DIRS", str(DATA_DIR / "models")).split(",")
              if entry.strip()]
# The bearer token Prometheus sends to /metrics; without one only signed-in staff can read it.
METRICS_TOKEN = os.environ.get("FACTORY_METRICS_TOKEN", "")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# A node that has not answered a heartbeat for this long is marked unhealthy.
NODE_HEARTBEAT_INTERVAL_S = int(os.environ.get("FACTORY_HEARTBEAT_INTERVAL_S", "15"))
NODE_HEARTBEAT_TIMEOUT_S = int(os.environ.get("FACTORY_HEARTBEAT_TIMEOUT_S", "60"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "accounts",
    "cluster",
    "assets",
    "serving",
    "workbridge",
    "rag_studio",
    "enhancement",
    "agent_studio",
    "runtime",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The language: the browser's Accept-Language (or the language cookie), then the signed-in user's choice.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "accounts.middleware.UserLanguageMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "accounts.middleware.CurrentWorkspaceMiddleware",
]

ROOT_URLCONF = "factory.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.context_processors.workspaces",
            ],
        },
    },
]
WSGI_APPLICATION = "factory.wsgi.application"
ASGI_APPLICATION = "factory.asgi.application"


def _database() -> dict:
    url = os.environ.get("DATABASE_URL")
    database = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True) if url else {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "db.sqlite3",
        # A file, not memory, so that the Celery worker processes started by the tests share the test database.
        "TEST": {"NAME": str(DATA_DIR / "test_db.sqlite3")},
    }
    if database["ENGINE"] == "django.db.backends.sqlite3":
        database["CONN_MAX_AGE"] = 0
        # WAL lets the web process read while a worker writes; IMMEDIATE avoids lock upgrades that fail under load.
        database["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        }
    return database


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "factory",
        "OPTIONS": redis_connections.options(),
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
# Each language is named in itself, so that the switch reads right whichever is active.
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
# The catalogues (locale/<lang>/LC_MESSAGES/django.po, djangojs.po) are compiled by setup and `make test`, never
# committed as .mo files.
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "accounts.errors.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "AI Factory API",
    "DESCRIPTION": "Workspaces, keys, the GPU pool, serving, RAG and agents.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

# Hosts (`*.corp.example`) and networks (`10.0.0.0/8`) every workspace's user-supplied URLs may reach though they
# are not public (workbridge/egress.py); each workspace's admins can add their own.
EGRESS_ALLOW = [entry.strip() for entry in os.environ.get("FACTORY_EGRESS_ALLOW", "").split(",") if entry.strip()]
# The names /mcp answers to (Host and Origin are checked against them: DNS rebinding). Loopback, FACTORY_HOST and
# the specific ALLOWED_HOSTS by default; FACTORY_MCP_ALLOWED_HOSTS replaces the list.
MCP_ALLOWED_HOSTS = [host for host in os.environ.get("FACTORY_MCP_ALLOWED_HOSTS", "").split(",") if host] or [
    "127.0.0.1", "localhost", "[::1]",
    *(host for host in [os.environ.get("FACTORY_HOST", ""), *ALLOWED_HOSTS] if host not in ("", "*", "0.0.0.0"))]
# The operator's catalogue of local MCP commands (workbridge/mcp_catalogue.py): the only commands a workspace can
# have the platform run, each sandboxed unless its entry says why not.
MCP_COMMANDS_FILE = Path(os.environ.get("FACTORY_MCP_COMMANDS") or DATA_DIR / "mcp-commands.toml")
# Each process keeps one open session per MCP server it uses (workbridge/mcp_client.py): at most MCP_POOL_SIZE (the
# least recently used closed beyond; 0: a session per call), each closed after MCP_POOL_IDLE_S unused.
MCP_POOL_SIZE = int(os.environ.get("FACTORY_MCP_POOL_SIZE", "16"))
MCP_POOL_IDLE_S = float(os.environ.get("FACTORY_MCP_POOL_IDLE_S", "300"))
# Who may create workspaces: `staff` (platform administrators hand them out) or `anyone` signed in.
WORKSPACE_CREATION = os.environ.get("FACTORY_WORKSPACE_CREATION", "staff")
if WORKSPACE_CREATION not in ("staff", "anyone"):
    raise ImproperlyConfigured(f"FACTORY_WORKSPACE_CREATION must be 'staff' or 'anyone', not '{WORKSPACE_CREATION}'.")
# Python tools run under bubblewrap; `unsafe-dev` runs them without it (rlimits only), for machines without user
# namespaces, and the GUI says so.
SANDBOX_MODE = os.environ.get("FACTORY_SANDBOX", "bwrap")
# Each python tool run's address space and processes (the CPU limit is its timeout).
SANDBOX_MEMORY_MB = int(os.environ.get("FACTORY_SANDBOX_MEMORY_MB", "512"))
SANDBOX_PROCESSES = int(os.environ.get("FACTORY_SANDBOX_PROCESSES", "32"))

# RAG ingestion. Embedding batches are sent `RAG_EMBED_CONCURRENCY` at a time to an embedding deployment; a local
# sentence-transformers model uses that many torch threads instead, unless FACTORY_TORCH_THREADS says otherwise
# (the web server sets 1 per worker process: see scripts/proc.sh).
RAG_UPLOAD_MAX_BYTES = int(os.environ.get("FACTORY_RAG_UPLOAD_MAX_BYTES", str(50 * 1024 * 1024)))
# The most a DOCX/XLSX may unpack to (their readers hold it all in memory): an archive declaring more is refused.
RAG_MAX_UNPACKED_BYTES = int(os.environ.get("FACTORY_RAG_MAX_UNPACKED_BYTES", str(256 * 1024 * 1024)))
# OCR of scanned pages and images (rag_studio/pipeline/ocr/): a document with more pages to read than
# RAG_OCR_MAX_PAGES, or an image (a frame) larger than RAG_OCR_MAX_PIXELS, fails at the parse stage with the limit (a
# PDF page is rendered smaller instead: an A3 page at 600 dpi is 70 megapixels); a page still being read after
# RAG_OCR_PAGE_TIMEOUT_S fails the document, keeping the pages before it. A document reads pages for at most
# RAG_OCR_TURN_S, then goes back in line with what it read, so that a long scan never holds a worker while others
# wait. Pages read with less confidence than RAG_OCR_LOW_CONFIDENCE are flagged; the models run on RAG_OCR_THREADS
# threads in each ingestion process.
RAG_OCR_MAX_PAGES = int(os.environ.get("FACTORY_RAG_OCR_MAX_PAGES", "1000"))
RAG_OCR_MAX_PIXELS = int(os.environ.get("FACTORY_RAG_OCR_MAX_PIXELS", str(100_000_000)))
RAG_OCR_PAGE_TIMEOUT_S = float(os.environ.get("FACTORY_RAG_OCR_PAGE_TIMEOUT_S", "120"))
RAG_OCR_TURN_S = float(os.environ.get("FACTORY_RAG_OCR_TURN_S", "30"))
RAG_OCR_LOW_CONFIDENCE = float(os.environ.get("FACTORY_RAG_OCR_LOW_CONFIDENCE", "0.8"))
RAG_OCR_THREADS = int(os.environ.get("FACTORY_RAG_OCR_THREADS", "1"))
# Work that stops without finishing (its worker died, or a time limit stopped it) is taken over this many times,
# then fails with the reason; each task kind's soft time limit (the hard one is a minute later; factory/celery.py).
RAG_INGEST_MAX_ATTEMPTS = int(os.environ.get("FACTORY_RAG_INGEST_MAX_ATTEMPTS", "3"))
RAG_INGEST_TIME_LIMIT_S = float(os.environ.get("FACTORY_RAG_INGEST_TIME_LIMIT_S", "1800"))
RAG_EVAL_MAX_ATTEMPTS = int(os.environ.get("FACTORY_RAG_EVAL_MAX_ATTEMPTS", "3"))
RAG_EVAL_TIME_LIMIT_S = float(os.environ.get("FACTORY_RAG_EVAL_TIME_LIMIT_S", "3000"))
RAG_EVAL_LEASE_S = float(os.environ.get("FACTORY_RAG_EVAL_LEASE_S", "60"))
# A queued eval set, eval run or tuning whose task message was sent this long ago and is no longer in the broker
# (lost, say with a Redis restart) is sent again; one still waiting its turn is left alone.
RAG_QUEUED_REDISPATCH_S = float(os.environ.get("FACTORY_RAG_QUEUED_REDISPATCH_S", "120"))
# Node jobs (cluster/deadlines.py): a queued job not taken this long on a healthy node is sent again, and a running
# one whose worker stopped its heartbeat is run again, CLUSTER_JOB_MAX_DISPATCHES times in all; then it fails.
CLUSTER_JOB_QUEUED_DEADLINE_S = float(os.environ.get("FACTORY_JOB_QUEUED_DEADLINE_S", "120"))
CLUSTER_JOB_HEARTBEAT_S = float(os.environ.get("FACTORY_JOB_HEARTBEAT_S", "20"))
CLUSTER_JOB_MAX_DISPATCHES = int(os.environ.get("FACTORY_JOB_MAX_DISPATCHES", "3"))
CLUSTER_JOB_SWEEP_INTERVAL_S = float(os.environ.get("FACTORY_JOB_SWEEP_INTERVAL_S", "15"))
# The shared pool's scheduler (cluster/scheduling/): a pass on every submit and job end and every POOL_INTERVAL_S;
# a job runs POOL_MIN_RUN_S before it can be preempted (urgent work excepted); a signalled job not checkpointed within
# POOL_GRACE_S is stopped; a job waiting POOL_AGING_S goes before fair share, POOL_STARVING_S drains a node for a
# gang, POOL_PROMOTE_S orders a job one class higher. CPU slots a node without GPUs offers (0: one per core).
POOL_INTERVAL_S = float(os.environ.get("FACTORY_POOL_INTERVAL_S", "30"))
POOL_MIN_RUN_S = float(os.environ.get("FACTORY_POOL_MIN_RUN_S", "600"))
POOL_GRACE_S = float(os.environ.get("FACTORY_POOL_GRACE_S", "120"))
POOL_AGING_S = float(os.environ.get("FACTORY_POOL_AGING_S", "172800"))
POOL_STARVING_S = float(os.environ.get("FACTORY_POOL_STARVING_S", "1800"))
POOL_PROMOTE_S = float(os.environ.get("FACTORY_POOL_PROMOTE_S", "14400"))
POOL_CPU_SLOTS = int(os.environ.get("FACTORY_POOL_CPU_SLOTS", "0"))
RAG_EMBED_BATCH_SIZE = int(os.environ.get("FACTORY_RAG_EMBED_BATCH_SIZE", "32"))
RAG_EMBED_CONCURRENCY = int(os.environ.get("FACTORY_RAG_EMBED_CONCURRENCY", "2"))
# A background process (cluster/cpu_budget.py) computes on the threads the node's engines leave it.
TORCH_THREADS = int(os.environ.get("FACTORY_TORCH_THREADS") or (
    cpu_budget.budget().background_threads if cpu_budget.is_background_process() else RAG_EMBED_CONCURRENCY))
# Queued documents of one knowledge base that a worker ingests together (embedded in shared model calls, indexed in
# one write); while other workspaces' documents wait, a group holds RAG_INGEST_SHARED_GROUP_DOCS, so their turn
# comes soon (rag_studio/pipeline/line.py).
RAG_INGEST_GROUP_DOCS = int(os.environ.get("FACTORY_RAG_INGEST_GROUP_DOCS", "32"))
RAG_INGEST_SHARED_GROUP_DOCS = int(os.environ.get("FACTORY_RAG_INGEST_SHARED_GROUP_DOCS", "4"))
# A worker's turn in the line lasts about this long: past it, while another workspace's documents wait, it finishes
# the documents in hand and hands the rest of its group back (rag_studio/pipeline/line.py's Turn).
RAG_INGEST_TURN_S = float(os.environ.get("FACTORY_RAG_INGEST_TURN_S", "10"))
# A knowledge base that finishes indexing has its default retrieval settings measured on questions drawn from its own
# text, and the winner adopted where it beats the fixed default (rag_studio/evals/adaptive.py); "off" leaves every
# knowledge base on the fixed default until someone tunes it.
RAG_ADAPTIVE_DEFAULTS = os.environ.get("FACTORY_RAG_ADAPTIVE_DEFAULTS", "on") != "off"
# Where new knowledge bases keep their indexes: embedded (files in this node's data dir) or pgvector (Postgres with the
# vector extension, shared by every node: rag_studio/search/pgvector_store.py); `manage.py move_index` moves one.
RAG_INDEX_BACKEND = os.environ.get("FACTORY_RAG_INDEX_BACKEND", "embedded")
if RAG_INDEX_BACKEND not in ("embedded", "pgvector"):
    raise ImproperlyConfigured(f"FACTORY_RAG_INDEX_BACKEND must be embedded or pgvector, not {RAG_INDEX_BACKEND!r}")
# The Postgres database of the pgvector backend; by default the default database (DATABASE_URL).
RAG_PGVECTOR_URL = os.environ.get("FACTORY_RAG_PGVECTOR_URL", "")
# Uploaded documents, on storage every ingesting node mounts at this path when workers on several nodes ingest
# (default: rag/kb-<id>/uploads in the data dir; a directory outside it is not in `manage.py backup`).
RAG_UPLOADS_DIR = Path(os.environ["FACTORY_RAG_UPLOADS_DIR"]).resolve() if os.environ.get(
    "FACTORY_RAG_UPLOADS_DIR") else None
# The ingestion workers' processes in all (every `scripts/proc.sh worker`'s FACTORY_WORKER_CONCURRENCY): the line
# keeps that many messages waiting in the broker, no more.
RAG_INGEST_SLOTS = int(os.environ.get("FACTORY_RAG_INGEST_SLOTS") or os.environ.get("FACTORY_WORKER_CONCURRENCY")
                       or "2")
# The node worker's processes (`scripts/proc.sh node`): for the line's time estimates of replica and training jobs.
NODE_CONCURRENCY = int(os.environ.get("FACTORY_NODE_CONCURRENCY", "2"))
# The interactive workers' processes in all (`scripts/proc.sh interactive`): for the line's time estimates.
INTERACTIVE_SLOTS = int(os.environ.get("FACTORY_INTERACTIVE_SLOTS") or os.environ.get(
    "FACTORY_INTERACTIVE_CONCURRENCY") or "1")
# Per-workspace limits an operator may set (0: none): documents being ingested at once (the rest wait their turn in
# the line, saying so), and evaluations, tunings and calibrations queued or running at once (one more is a 429).
RAG_WORKSPACE_MAX_IN_FLIGHT = int(os.environ.get("FACTORY_WORKSPACE_MAX_INGESTING", "0"))
WORKSPACE_MAX_JOBS = int(os.environ.get("FACTORY_WORKSPACE_MAX_JOBS", "0"))
# A worker holds a document for this long after each step; a document whose lease ran out is resumed elsewhere.
RAG_INGEST_LEASE_S = float(os.environ.get("FACTORY_RAG_INGEST_LEASE_S", "60"))
RAG_STALLED_CHECK_INTERVAL_S = float(os.environ.get("FACTORY_RAG_STALLED_CHECK_INTERVAL_S", "15"))
# The embedded index store (rag_studio/search/index_store.py): each write adds a small segment; once this many
# segments of a similar size pile up, a background merge rewrites them as one. A segment of at least
# RAG_INDEX_ANN_THRESHOLD chunks also gets an approximate (IVF) dense index, searched in RAG_INDEX_ANN_NPROBE of its
# clusters; smaller ones are searched exactly.
RAG_INDEX_MERGE_FACTOR = int(os.environ.get("FACTORY_RAG_INDEX_MERGE_FACTOR", "10"))
RAG_INDEX_ANN_THRESHOLD = int(os.environ.get("FACTORY_RAG_INDEX_ANN_THRESHOLD", "50000"))
RAG_INDEX_ANN_NPROBE = int(os.environ.get("FACTORY_RAG_INDEX_ANN_NPROBE", "32"))
# "off" searches every segment exactly even where it has an IVF index (slower past a few hundred thousand chunks).
RAG_INDEX_ANN_SEARCH = os.environ.get("FACTORY_RAG_INDEX_ANN_SEARCH", "on") != "off"

# Asset bundles: this instance always trusts its own key (DATA_DIR/instance_key.pem, made on first use).
TRUSTED_BUNDLE_KEYS = [key.strip() for key in os.environ.get("FACTORY_TRUSTED_BUNDLE_KEYS", "").split(",")
                       if key.strip()]
BUNDLE_MAX_BYTES = int(os.environ.get("FACTORY_BUNDLE_MAX_BYTES", str(4 * 1024 ** 3)))

# Rate limits (limits' notation: "600/minute", "10 per 15 minutes"), each a sliding window counted in Redis so that
# every web process agrees. The gateway counts per API key and per workspace (the platform's own calls for a
# workspace count against the workspace); the web chat per client address (at the app's rate) and per conversation.
# How long a request to a deployment whose replicas are starting (or restarting after a crash) waits for one.
GATEWAY_START_WAIT_S = float(os.environ.get("FACTORY_GATEWAY_START_WAIT_S", "30"))
GATEWAY_RATE_PER_KEY = os.environ.get("FACTORY_GATEWAY_RATE_PER_KEY", "1200/minute")
GATEWAY_RATE_PER_WORKSPACE = os.environ.get("FACTORY_GATEWAY_RATE_PER_WORKSPACE", "3000/minute")
WIDGET_RATE_PER_CONVERSATION = os.environ.get("FACTORY_WIDGET_RATE_PER_CONVERSATION", "20/minute")
# Failed sign-ins per user name and per client address, on the login page and POST /api/auth/login/.
LOGIN_RATE = os.environ.get("FACTORY_LOGIN_RATE", "10 per 15 minutes")
# Bodies on the Django paths (uploads, bundle imports) are counted as they arrive and refused past this; the lean
# paths (/v1/, /api/apps/, /mcp) refuse past DATA_UPLOAD_MAX_MEMORY_SIZE.
MAX_REQUEST_BYTES = int(os.environ.get("FACTORY_MAX_REQUEST_BYTES", str(2 * 1024 ** 3)))
# How long a service token (the platform's own processes calling the gateway for a workspace) stays valid.
SERVICE_TOKEN_TTL_S = int(os.environ.get("FACTORY_SERVICE_TOKEN_TTL_S", str(12 * 3600)))

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = "default"
# Long tasks are acknowledged only when done, and a task whose worker died goes back to the queue.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # How long an unacknowledged task waits before Redis hands it to another worker.
    "visibility_timeout": int(os.environ.get("FACTORY_TASK_VISIBILITY_TIMEOUT_S", "3600")),
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ROUTES = {"rag_studio.tasks.*": {"queue": "ingest"}}
# An agent or workflow run whose worker has not renewed its lease for this long is taken over by another
# worker from its last checkpoint; beat looks for such runs every AGENT_STALLED_CHECK_INTERVAL_S.
RUN_LEASE_S = float(os.environ.get("FACTORY_RUN_LEASE_S", "120"))
AGENT_STALLED_CHECK_INTERVAL_S = float(os.environ.get("FACTORY_AGENT_STALLED_CHECK_S", "30"))
# The Celery queue agent runs go to (evaluations are interactive work: cluster/queues.py); a pool may give them
# workers of their own.
AGENT_QUEUE = os.environ.get("FACTORY_AGENT_QUEUE", "default")
# The most items a workflow's iteration node goes through in one run (a longer list fails the node).
WORKFLOW_MAX_ITERATIONS = int(os.environ.get("FACTORY_WORKFLOW_MAX_ITERATIONS", "100"))
# How long a published workflow app's caller waits for its run before the call fails (the run goes on).
WORKFLOW_APP_WAIT_S = float(os.environ.get("FACTORY_WORKFLOW_APP_WAIT_S", "600"))
CELERY_BEAT_SCHEDULE = {
    "cluster-pool-schedule": {
        "task": "cluster.tasks.schedule_pool",
        "schedule": POOL_INTERVAL_S,
    },
    "cluster-heartbeats": {
        "task": "cluster.tasks.request_heartbeats",
        "schedule": float(NODE_HEARTBEAT_INTERVAL_S),
    },
    "serving-replica-health": {
        "task": "serving.tasks.check_replicas",
        "schedule": float(os.environ.get("FACTORY_REPLICA_CHECK_INTERVAL_S", "5")),
    },
    "rag-resume-stalled-documents": {
        "task": "rag_studio.tasks.resume_stalled_documents",
        "schedule": RAG_STALLED_CHECK_INTERVAL_S,
    },
    "agents-resume-stalled-runs": {
        "task": "agent_studio.tasks.resume_stalled_runs",
        "schedule": AGENT_STALLED_CHECK_INTERVAL_S,
    },
    "workflows-resume-stalled-runs": {
        "task": "agent_studio.workflows.tasks.resume_stalled_workflow_runs",
        "schedule": AGENT_STALLED_CHECK_INTERVAL_S,
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("FACTORY_LOG_LEVEL", "INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        **{name: {"level": "ERROR"} for name in LOGGERS_QUIET_ON_CPU},
    },
}
