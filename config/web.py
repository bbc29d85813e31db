"""The web process: the ASGI application of config/asgi.py, its PostgreSQL connections pooled
(config/postgresql/pool.py). The production `web` command serves this one."""

import os

from config.postgresql.pool import pool_connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
pool_connections()  # before Django starts and opens any connection

from config.asgi import application  # noqa: E402

__all__ = ["application"]
