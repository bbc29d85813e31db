"""The one settings module. Everything that differs between machines comes from the environment."""

import math
import os
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


TEN_YEARS_S = 10 * 365 * 24 * 3600


def env_number(name: str, default: float, *, whole: bool = False, most: float | None = None) -> Any:
    """A number from the environment, from 0 to `most` (a whole number: a count or a size, unbounded
    unless given; else seconds, at most ten years, past which a deadline overflows a date);
    anything else stops the start with the variable's name, rather than a bare ValueError or a
    server error at each request that uses it."""
    most = most if most is not None else math.inf if whole else TEN_YEARS_S
    raw = os.environ.get(name)
    if raw is None:
        return int(default) if whole else float(default)
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} is a {'whole ' if whole else ''}number, not {raw!r}.") from None
    if not 0 <= value <= most:  # NaN too
        raise ImproperlyConfigured(f"{name} is from 0 {'up' if math.isinf(most) else f'to {most:g}'}, not {raw!r}.")
    return value


DEBUG = env_bool("DEBUG", True)

# Where Agora writes (the SQLite database, the embedded Redis, the beat schedule, static files).
# Production never writes into the code directory: with DEBUG off it must be named.
if os.environ.get("AGORA_DATA_DIR"):
    DATA_DIR = Path(os.environ["AGORA_DATA_DIR"]).resolve()
elif DEBUG:
    DATA_DIR = BASE_DIR / "var"
else:
    raise ImproperlyConfigured("AGORA_DATA_DIR must be set when DEBUG is off (a directory outside the code).")
DATA_DIR.mkdir(parents=True, exist_ok=True)


def load_secret_key() -> str:
    """SECRET_KEY from the environment; in DEBUG, generated once into the data dir so sessions survive restarts."""
    if key := os.environ.get("SECRET_KEY"):
        return key
    if not DEBUG:
        raise RuntimeError("SECRET_KEY must be set when DEBUG is off.")
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = load_secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "guardian",
    "django_ratelimit",  # its checks: the cache it counts in must be shared
    "channels",
    "accounts",
    "journal",
    "sagas",
    "agents",
    "gateways.mcp",
    "gateways.a2a",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files, right after the HTTPS redirect
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "config.middleware.RequireContentLength",
    "config.middleware.RefuseUnstorableInput",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

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
            ],
        },
    },
]

# Database: SQLite in the data dir unless DATABASE_URL says otherwise (PostgreSQL in production).
DATABASES: dict[str, dict[str, Any]] = {
    "default": dj_database_url.config(  # type: ignore[dict-item]
        default=f"sqlite:///{DATA_DIR / 'agora.sqlite3'}", conn_max_age=0, conn_health_checks=True
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["ENGINE"] = "config.sqlite"  # writers queue on a file lock (config/sqlite/base.py)
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets readers proceed while one process writes; IMMEDIATE takes the write lock at BEGIN,
        # so concurrent writers queue on the busy timeout instead of failing mid-transaction. Reads
        # through a memory map and a 32 MB page cache save about 5% of an agent turn.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
        "PRAGMA mmap_size=268435456; PRAGMA cache_size=-32000;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file, not :memory:, so that a Celery worker process started by the tests shares it.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "config.postgresql"  # BEGIN goes with a first statement (config/postgresql/)
    # The hot statements are prepared once per connection; off behind a pooler in transaction mode.
    DATABASES["default"].setdefault("OPTIONS", {})["prepared_statements"] = env_bool("AGORA_PG_PREPARE", True)
    # A database host that does not answer fails a connection after this many seconds, where libpq
    # would wait for it as long as TCP does: a request gets its error, `/healthz` says `db: down`.
    DATABASES["default"]["OPTIONS"].setdefault(
        "connect_timeout", env_number("AGORA_DB_CONNECT_TIMEOUT_S", 5, whole=True)
    )
# The most connections the web process keeps open to PostgreSQL, lent to its requests in turn
# (config/web.py); 0: a connection of its own for each request. Only the web process pools.
AGORA_DB_POOL_MAX = env_number("AGORA_DB_POOL_MAX", 20, whole=True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "accounts.User"
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
GUARDIAN_RAISE_403 = False
ANONYMOUS_USER_NAME = None  # no anonymous object permissions: an outsider sees nothing
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise also serves what `collectstatic` puts here
STATICFILES_DIRS = [BASE_DIR / "static"]  # the dashboard's CSS and script
# WhiteNoise serves the static files (daphne serves none): straight from the finders, so that no
# `collectstatic` step is needed; they are indexed once when a web process starts.
WHITENOISE_USE_FINDERS = True

# A deployment behind TLS (a proxy that terminates HTTPS and sets X-Forwarded-Proto): one switch
# turns on everything `manage.py check --deploy` asks for. Off by default, since `make run`
# serves plain HTTP on loopback.
BEHIND_TLS = env_bool("AGORA_BEHIND_TLS", False)
if BEHIND_TLS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # Probes and scrapes from inside the network speak plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
    SECURE_HSTS_SECONDS = env_number("AGORA_HSTS_SECONDS", 365 * 24 * 3600, whole=True)
    # What check --deploy asks for; a domain whose subdomains are not all HTTPS turns these off
    # (check --deploy then warns security.W005 / W021).
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("AGORA_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("AGORA_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# Redis: the embedded server started by `make run` unless REDIS_URL points elsewhere.
EMBEDDED_REDIS_PORT = env_number("AGORA_REDIS_PORT", 6390, whole=True, most=65535)
REDIS_URL = os.environ.get("REDIS_URL", f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0")


def channel_layers_for(redis_url: str) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # A socket read timeout above channels_redis's 5 s blocking pop: at redis-py's default
            # (also 5 s) an idle WebSocket's receive times out and its consumer dies.
            "CONFIG": {"hosts": [{"address": redis_url, "socket_timeout": 30}], "capacity": 1000, "expiry": 30},
        }
    }


CHANNEL_LAYERS = channel_layers_for(REDIS_URL)


def caches_for(redis_url: str) -> dict[str, Any]:
    """The default cache in Redis, so that what web processes count (sign-in attempts, agents'
    request quotas) is counted once for all of them."""
    return {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url,
                        "KEY_PREFIX": "agora"}}  # fmt: skip


CACHES = caches_for(REDIS_URL)
# django-ratelimit's check knows django-redis, not Django's own RedisCache; what it counts with
# (add as SET NX, incr as INCRBY) is atomic there too.
SILENCED_SYSTEM_CHECKS = ["django_ratelimit.W001"]

# Brute force and quotas (accounts/throttles.py). Rates are "<count>/<period>", periods s, m, h, d
# with an optional multiple ("10/15m"). The client address is the peer's unless that many
# reverse proxies in front of the web processes append to X-Forwarded-For.
AGORA_TRUSTED_PROXIES = env_number("AGORA_TRUSTED_PROXIES", 0, whole=True)
AGORA_SIGNIN_RATE_PER_ADDRESS = os.environ.get("AGORA_SIGNIN_RATE_PER_ADDRESS", "30/m")
AGORA_SIGNIN_RATE_PER_ACCOUNT = os.environ.get("AGORA_SIGNIN_RATE_PER_ACCOUNT", "10/m")
AGORA_AGENT_RATE = os.environ.get("AGORA_AGENT_RATE", "50/s")

# Metrics (README, "Observability"). Each process of a host counts into its own file in
# PROMETHEUS_MULTIPROC_DIR (read by prometheus-client itself when it is imported); `/metrics` adds
# them up. Without a token only a loopback client while DEBUG is on may read them.
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
AGORA_METRICS_TOKEN = os.environ.get("AGORA_METRICS_TOKEN", "")
# The queues whose depth `/metrics` reports: those the workers consume (the worker command's variable).
AGORA_METRICS_QUEUES = env_list("WORKER_QUEUES", "celery")

# Celery. The database is the source of truth and Redis only rings doorbells, so these settings
# favour "run again" over "lose": every task is written to be safe when delivered twice.
CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_TRANSPORT = "config.broker:Transport"  # kombu's Redis transport, a client per channel
CELERY_RESULT_BACKEND = None  # nothing reads task results; outcomes live in the database
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-task leaves the message to be redelivered
CELERY_TASK_REJECT_ON_WORKER_LOST = True  # ...including when the child process dies (kill -9)
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a busy worker does not hoard messages others could run
CELERY_TASK_SERIALIZER = "json"  # tasks take ids, never pickled objects
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True  # Redis may come up a moment after the worker
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Unacked messages return to the queue after this long; the reconciler covers anything sooner.
    "visibility_timeout": 600,
}
CELERY_TASK_IGNORE_RESULT = True
# A worker process keeps its database connection from one task to the next (Celery's Django
# fixup otherwise closes it around every task): connecting costs more than most turns. A task
# that hit a database error closes it (agents.executor.run_turn).
CELERY_DB_REUSE_MAX = 1000
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# The reconciler reclaims a dead worker's turns once their lease has lapsed: a dead host's runs
# move on within AGORA_LEASE_S + this interval (README, "Failover").
RECONCILE_INTERVAL_S = env_number("AGORA_RECONCILE_INTERVAL_S", 2)
# A run whose turn was taken back more often than this in a row fails: a turn that raises each time
# it is made (a bug, a model's answer no code foresaw) would otherwise be made again, model call and
# all, for ever.
AGORA_MAX_RECLAIMS = env_number("AGORA_MAX_RECLAIMS", 5, whole=True)
CELERY_BEAT_SCHEDULE = {
    "reconcile": {"task": "sagas.tasks.reconcile", "schedule": RECONCILE_INTERVAL_S},
    "resume-prompts": {"task": "agents.orchestrator.resume_prompts", "schedule": RECONCILE_INTERVAL_S},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["accounts.throttles.AgentQuota"],
    "NUM_PROXIES": AGORA_TRUSTED_PROXIES,  # DRF's own address throttles, should any view use one
    "DEFAULT_PARSER_CLASSES": ["config.parsers.LimitedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "config.openapi.AutoSchema",  # enums, string bounds, own descriptions
    "EXCEPTION_HANDLER": "config.problems.problem_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agora API",
    "DESCRIPTION": "Sagas in which agents and people work together.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Choice sets that share a field name, named for a client generator (config/openapi.py).
    "ENUM_NAME_OVERRIDES": {
        "SagaStatusEnum": "sagas.models.Saga.Status",
        "RunStatusEnum": "sagas.models.Run.Status",
        "RequestStatusEnum": "sagas.models.AgentRequest.Status",
        "HumanRequestStatusEnum": "sagas.models.HumanRequest.Status",
        "CollaboratorKindEnum": "sagas.models.Collaborator.Kind",
        "SteeringKindEnum": "sagas.models.SteeringItem.Kind",
        "ExternalRunStatusEnum": ["working", "idle", "finished"],
        "SagaEndStatusEnum": ["completed", "cancelled"],
        "PendingStatusEnum": ["pending"],
    },
}

# Limits (DESIGN.md §3.9).
AGORA_MAX_PAYLOAD_BYTES = env_number("AGORA_MAX_PAYLOAD_BYTES", 256 * 1024, whole=True)
DATA_UPLOAD_MAX_MEMORY_SIZE = AGORA_MAX_PAYLOAD_BYTES + 64 * 1024
# How deep any JSON input (request bodies, WebSocket messages, a model's tool arguments) may nest.
AGORA_MAX_JSON_DEPTH = env_number("AGORA_MAX_JSON_DEPTH", 64, whole=True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "daphne": {"level": "WARNING"},
        "celery.app.trace": {"level": "WARNING"},  # one line per task is noise; failures still show
        "celery.worker.strategy": {"level": "WARNING"},
    },
}
AGORA_MAX_HOPS = env_number("AGORA_MAX_HOPS", 8, whole=True)
AGORA_MAX_PENDING_PER_SENDER = env_number("AGORA_MAX_PENDING_PER_SENDER", 64, whole=True)
AGORA_MAX_STEERING_BACKLOG = env_number("AGORA_MAX_STEERING_BACKLOG", 1000, whole=True)
# A saga's goal and a collaborator's task, in characters (a goal is a brief, not a document).
AGORA_MAX_GOAL_CHARS = env_number("AGORA_MAX_GOAL_CHARS", 20000, whole=True)
# Budgets that would multiply without a cap (every other budget is per collaborator): delegates,
# unanswered forms, and HTTP waits in progress (each holds a Redis connection).
AGORA_MAX_DELEGATES_PER_AGENT = env_number("AGORA_MAX_DELEGATES_PER_AGENT", 16, whole=True)
AGORA_MAX_AGENTS_PER_SAGA = env_number("AGORA_MAX_AGENTS_PER_SAGA", 200, whole=True)
AGORA_MAX_OPEN_FORMS_PER_AGENT = env_number("AGORA_MAX_OPEN_FORMS_PER_AGENT", 16, whole=True)
AGORA_MAX_OPEN_FORMS_PER_SAGA = env_number("AGORA_MAX_OPEN_FORMS_PER_SAGA", 200, whole=True)
AGORA_MAX_WAITS_PER_AGENT = env_number("AGORA_MAX_WAITS_PER_AGENT", 8, whole=True)
AGORA_MAX_WAITS_PER_SAGA = env_number("AGORA_MAX_WAITS_PER_SAGA", 128, whole=True)
AGORA_DEFAULT_WAIT_S = env_number("AGORA_DEFAULT_WAIT_S", 60)
AGORA_MAX_WAIT_S = env_number("AGORA_MAX_WAIT_S", 300)
AGORA_REQUEST_TTL_S = env_number("AGORA_REQUEST_TTL_S", 24 * 3600)
# Short, because a live worker never lets it lapse: its heartbeat renews the lease of every turn in
# flight every third of it (agents/heartbeat.py), through model calls and tools of any length.
AGORA_LEASE_S = env_number("AGORA_LEASE_S", 6)
AGORA_STEERING_POLL_MAX_S = env_number("AGORA_STEERING_POLL_MAX_S", 60)
# A run with more to do keeps its worker for its next turns until this much time has passed
# since the task started, then queues behind the others.
AGORA_TURN_SLICE_S = env_number("AGORA_TURN_SLICE_S", 0.1)
# Which agent profiles exist is the runtime's knowledge; the kernel asks it through this callable
# (a dotted path, so that the kernel never imports the runtime) before adding an internal agent.
AGORA_MISSING_PROFILES = "agents.models.missing_profiles"
# How long one routing step may take (the router's whole fallback chain) before another may retry it.
AGORA_ROUTING_LEASE_S = env_number("AGORA_ROUTING_LEASE_S", 180)
# How long one of a brain's signals may take to match one prompt; past it, it counts as no match.
AGORA_SIGNAL_TIMEOUT_S = env_number("AGORA_SIGNAL_TIMEOUT_S", 0.05)
# Extra live parts of the saga page, rendered by the runtime (the kernel's page imports none of it):
# name → (title, context callable(request, saga) -> dict, template, event type prefixes that refresh it).
AGORA_SAGA_PANELS: dict[str, tuple[str, str, str, list[str]]] = {
    "prompts": (
        "Prompts",
        "agents.orchestrator.views.prompts_part",
        "agents/parts/prompts.html",
        ["prompt.", "plan.", "primary.", "review.", "worker_", "run.", "hook_"],
    ),
}
AGORA_RERING_S = env_number("AGORA_RERING_S", 15)
AGORA_PLAYBOOK_DIRS = env_list("AGORA_PLAYBOOK_DIRS", "")
# Hook handlers run processes, HTTP calls and code for as long as their timeouts: only inside a
# Celery task. Unit tests that call `run_hooks` directly turn this on (agents.hooks.runner).
AGORA_HOOKS_INLINE = env_bool("AGORA_HOOKS_INLINE", False)
# Artifacts: the largest one a saga may hold (uploads over it are refused with payload_too_large),
# and what multipart framing, the name and the content type add to an upload's size, at most.
AGORA_MAX_ARTIFACT_BYTES = env_number("AGORA_MAX_ARTIFACT_BYTES", 5 * 1024 * 1024, whole=True)
AGORA_UPLOAD_FRAMING_BYTES = 64 * 1024
# A body declared over it (and its framing) stops being parsed at its first file.
FILE_UPLOAD_HANDLERS = [
    "sagas.artifacts.RefuseOversizedUploads",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]
# The largest request body the web server takes in (config/web_request.py); past it, 413 before the
# rest is read. By default twice the largest any endpoint accepts (an upload of the largest artifact,
# or a body the app reads whole: the REST API's JSON, forms, the A2A and MCP gateways, config/edge.py),
# so that a file a little over the limit still reaches the page that says why.
AGORA_MAX_BODY_BYTES = env_number(
    "AGORA_MAX_BODY_BYTES",
    2 * max(AGORA_MAX_ARTIFACT_BYTES + AGORA_UPLOAD_FRAMING_BYTES, DATA_UPLOAD_MAX_MEMORY_SIZE),
    whole=True,
)
# After that 413, how long the rest of the body is still read and dropped, at most (a client that
# sends its whole body before it reads the answer then reads the 413 instead of a reset).
AGORA_BODY_LINGER_S = env_number("AGORA_BODY_LINGER_S", 5)
# Teams: the budgets a new team starts with, and who counts its tokens (the runtime keeps them).
AGORA_TEAM_MAX_TEAMMATES = env_number("AGORA_TEAM_MAX_TEAMMATES", 8, whole=True)
AGORA_TEAM_MAX_TOKENS = env_number("AGORA_TEAM_MAX_TOKENS", 2000000, whole=True)
AGORA_TEAM_IDLE_TIMEOUT_S = env_number("AGORA_TEAM_IDLE_TIMEOUT_S", 3600)
AGORA_RUN_TOKENS = "agents.models.tokens_used"
# The A2A gateway: which exposed agent the host's own /.well-known/agent-card.json describes
# (`<saga id>/<agent name>`); unset, it is the instance's only exposed agent, if there is one.
AGORA_A2A_HOST_AGENT = os.environ.get("AGORA_A2A_HOST_AGENT", "")
# The address clients reach this instance at (scheme and host, such as https://agora.example.com):
# A2A agent cards name it, and the dashboard links to them with it. Empty: the host of each request.
AGORA_PUBLIC_URL = os.environ.get("AGORA_PUBLIC_URL", "").rstrip("/")
# Whether A2A push notifications may go to loopback and private addresses (a local webhook);
# off in production, where a client could otherwise make the workers call internal services.
AGORA_A2A_PUSH_PRIVATE_URLS = env_bool("AGORA_A2A_PUSH_PRIVATE_URLS", DEBUG)
# Outbound A2A (`ask_remote_agent`): whether a manager may allow remote agents at loopback and
# private addresses (the same rule as push notifications, its own switch); how long a call may
# take by default and at most; how many calls one agent may have open at once.
AGORA_A2A_REMOTE_PRIVATE_URLS = env_bool("AGORA_A2A_REMOTE_PRIVATE_URLS", DEBUG)
AGORA_A2A_REMOTE_TIMEOUT_S = env_number("AGORA_A2A_REMOTE_TIMEOUT_S", 60)
AGORA_A2A_REMOTE_MAX_TIMEOUT_S = env_number("AGORA_A2A_REMOTE_MAX_TIMEOUT_S", 600)
AGORA_A2A_REMOTE_MAX_OPEN = env_number("AGORA_A2A_REMOTE_MAX_OPEN", 16, whole=True)
