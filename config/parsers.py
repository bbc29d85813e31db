import io
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework.parsers import JSONParser


class LimitedJSONParser(JSONParser):
    """DRF's JSON parser with Django's body size limit applied to the bytes actually read.

    Django refuses a declared Content-Length over DATA_UPLOAD_MAX_MEMORY_SIZE when the body is
    read; this holds the limit whatever the stream turns out to contain. Either way the problem
    handler answers 413 `payload_too_large` before anything is parsed or stored.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and stream is not None:
            raw = stream.read(limit + 1)
            if len(raw) > limit:
                raise RequestDataTooBig(f"Limit is {limit} bytes for a request body.")
            stream = io.BytesIO(raw)
        return super().parse(stream, media_type, parser_context)
