import io
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from config.payloads import Unstorable, check_storable


class LimitedJSONParser(JSONParser):
    """DRF's JSON parser with Django's body size limit applied to the bytes actually read, and the
    body checked for what cannot be stored (config/payloads.py).

    Django refuses a declared Content-Length over DATA_UPLOAD_MAX_MEMORY_SIZE when the body is
    read; this holds the limit whatever the stream turns out to contain. Either way the problem
    handler answers 413 `payload_too_large` before anything is parsed or stored. A body nested too
    deep or holding unstorable text answers 400 `invalid_payload` (a ParseError).
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and stream is not None:
            raw = stream.read(limit + 1)
            if len(raw) > limit:
                raise RequestDataTooBig(f"Limit is {limit} bytes for a request body.")
            stream = io.BytesIO(raw)
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("The body nests too deep.") from None
        try:
            check_storable(data, where="body")
        except Unstorable as exc:
            raise ParseError(str(exc)) from None
        return data
