"""The web process: the ASGI application of config/asgi.py, its PostgreSQL connections pooled
(config/postgresql/pool.py), under daphne with its requests' bodies handled as
config/web_request.py says (form bodies left to Django, a body over AGORA_MAX_BODY_BYTES refused
unread). The production `web` command serves this one."""

import os

from config.postgresql.pool import pool_connections


def use_our_requests() -> None:
    from daphne import http_protocol

    from config.web_request import WebRequest

    http_protocol.WebRequest = WebRequest  # what daphne's protocol factory builds each request with


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
pool_connections()  # before Django starts and opens any connection
use_our_requests()

from config.asgi import application  # noqa: E402

__all__ = ["application"]
