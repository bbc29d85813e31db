"""The web process: the ASGI application of config/asgi.py, its PostgreSQL connections pooled
(config/postgresql/pool.py), under daphne with form bodies left to Django. The production `web`
command serves this one."""

import os
from typing import Any

from config.postgresql.pool import pool_connections


def leave_form_bodies_to_django() -> None:
    """Twisted, under daphne, parses every multipart POST body into arguments daphne never reads,
    and answers one it cannot parse with a bare `400` of its own (no body, no content type): the
    app never sees it, so a malformed upload got no problem+json and no code, and every upload was
    parsed twice. Twisted's switch for that parse (`parsePOSTFormSubmission`, hence the pin in
    requirements/base.txt) is off for daphne's requests: Django parses the body, and refuses a
    malformed one as everything else is refused."""
    from daphne import http_protocol

    class WebRequest(http_protocol.WebRequest):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)

    http_protocol.WebRequest = WebRequest  # what daphne's protocol factory builds each request with


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
pool_connections()  # before Django starts and opens any connection
leave_form_bodies_to_django()

from config.asgi import application  # noqa: E402

__all__ = ["application"]
