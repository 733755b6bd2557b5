"""Settings, read from the environment so that one codebase runs as the appliance and as a cluster.

FACTORY_ENV            dev (default) or prod; prod refuses the default secret key and turns DEBUG off
FACTORY_SECRET_KEY     required in prod
FACTORY_DATA_DIR       files, indexes, the SQLite database and engine logs (default ./data)
DATABASE_URL           Postgres in a cluster (default: SQLite in the data dir, WAL mode)
REDIS_URL              Celery broker, result backend and cache (default redis://127.0.0.1:6379/0)
FACTORY_NODE_NAME      this machine's name in the GPU pool; its worker listens on queue node.<name>
FACTORY_GATEWAY_URL    where workers reach the OpenAI-compatible gateway (default http://127.0.0.1:$FACTORY_PORT/v1)
FACTORY_RAG_*          ingestion limits and tuning, below
FACTORY_TRUSTED_BUNDLE_KEYS  other instances' public keys (base64, comma-separated) whose signed bundles are accepted
FACTORY_BUNDLE_MAX_BYTES     the most data one imported bundle may unpack to (default 4 GiB)
FACTORY_EGRESS_ALLOW   hosts and networks every workspace's tools may reach though they are not public
FACTORY_MCP_ALLOWED_HOSTS    the names /mcp answers to (default: loopback, FACTORY_HOST, ALLOWED_HOSTS)
FACTORY_SANDBOX        bwrap (default) or unsafe-dev: how python tools are isolated
FACTORY_SANDBOX_MEMORY_MB, FACTORY_SANDBOX_PROCESSES  each python tool run's memory and process limits (512, 32)
"""

import os
import socket
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

# Before torch is first imported by any process of the platform (and inherited by the engines it starts): OpenMP
# threads that sleep when idle instead of spinning. On a small CPU, torch's spinning threads (query embedding)
# and numpy's BLAS threads (dense search) otherwise take turns stealing each other's cores: hybrid retrieval p95
# at 100k chunks went from 146 ms to 52 ms on 2 cores (bench.retrieve).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

BASE_DIR = Path(__file__).resolve().parent.parent
DEV_SECRET_KEY = "dev-only-insecure-key-change-me"

FACTORY_ENV = os.environ.get("FACTORY_ENV", "dev")
SECRET_KEY = os.environ.get("FACTORY_SECRET_KEY") or DEV_SECRET_KEY
if FACTORY_ENV == "prod" and SECRET_KEY == DEV_SECRET_KEY:
    raise ImproperlyConfigured("FACTORY_SECRET_KEY must be set to a private value when FACTORY_ENV=prod.")
DEBUG = FACTORY_ENV != "prod" and os.environ.get("FACTORY_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("FACTORY_ALLOWED_HOSTS", "*").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("FACTORY_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

DATA_DIR = Path(os.environ.get("FACTORY_DATA_DIR", BASE_DIR / "data")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)
NODE_NAME = os.environ.get("FACTORY_NODE_NAME") or socket.gethostname().split(".")[0].lower()
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
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
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
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
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
# Python tools run under bubblewrap; `unsafe-dev` runs them without it (rlimits only), for machines without user
# namespaces, and the GUI says so.
SANDBOX_MODE = os.environ.get("FACTORY_SANDBOX", "bwrap")
# Each python tool run's address space and processes (the CPU limit is its timeout).
SANDBOX_MEMORY_MB = int(os.environ.get("FACTORY_SANDBOX_MEMORY_MB", "512"))
SANDBOX_PROCESSES = int(os.environ.get("FACTORY_SANDBOX_PROCESSES", "32"))
GATEWAY_URL = os.environ.get("FACTORY_GATEWAY_URL") or f"http://127.0.0.1:{os.environ.get('FACTORY_PORT', '8000')}/v1"

# RAG ingestion. Embedding batches are sent `RAG_EMBED_CONCURRENCY` at a time to an embedding deployment; a local
# sentence-transformers model uses that many torch threads instead, unless FACTORY_TORCH_THREADS says otherwise
# (the web server sets 1 per worker process: see scripts/proc.sh).
RAG_UPLOAD_MAX_BYTES = int(os.environ.get("FACTORY_RAG_UPLOAD_MAX_BYTES", str(50 * 1024 * 1024)))
# The most a DOCX/XLSX may unpack to (their readers hold it all in memory): an archive declaring more is refused.
RAG_MAX_UNPACKED_BYTES = int(os.environ.get("FACTORY_RAG_MAX_UNPACKED_BYTES", str(256 * 1024 * 1024)))
RAG_EMBED_BATCH_SIZE = int(os.environ.get("FACTORY_RAG_EMBED_BATCH_SIZE", "32"))
RAG_EMBED_CONCURRENCY = int(os.environ.get("FACTORY_RAG_EMBED_CONCURRENCY", "2"))
TORCH_THREADS = int(os.environ.get("FACTORY_TORCH_THREADS") or RAG_EMBED_CONCURRENCY)
# Queued documents of one knowledge base that a worker ingests together (embedded in shared model calls, indexed in
# one write).
RAG_INGEST_GROUP_DOCS = int(os.environ.get("FACTORY_RAG_INGEST_GROUP_DOCS", "32"))
# A worker holds a document for this long after each step; a document whose lease ran out is resumed elsewhere.
RAG_INGEST_LEASE_S = float(os.environ.get("FACTORY_RAG_INGEST_LEASE_S", "60"))
RAG_STALLED_CHECK_INTERVAL_S = float(os.environ.get("FACTORY_RAG_STALLED_CHECK_INTERVAL_S", "15"))

# Asset bundles: this instance always trusts its own key (DATA_DIR/instance_key.pem, made on first use).
TRUSTED_BUNDLE_KEYS = [key.strip() for key in os.environ.get("FACTORY_TRUSTED_BUNDLE_KEYS", "").split(",")
                       if key.strip()]
BUNDLE_MAX_BYTES = int(os.environ.get("FACTORY_BUNDLE_MAX_BYTES", str(4 * 1024 ** 3)))

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
CELERY_BEAT_SCHEDULE = {
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
        "schedule": 30.0,
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("FACTORY_LOG_LEVEL", "INFO")},
    "loggers": {"httpx": {"level": "WARNING"}},
}
