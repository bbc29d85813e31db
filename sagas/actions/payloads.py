"""What every payload a kernel action stores is checked against."""

import json
from typing import Any

from django.conf import settings

from sagas import errors


def payload_size(payload: Any) -> int:
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())


def check_payload(payload: Any, *, field: str = "payload") -> None:
    limit = settings.AGORA_MAX_PAYLOAD_BYTES
    if payload_size(payload) > limit:
        raise errors.PayloadTooLarge(f"Limit is {limit} bytes.", field=field)
