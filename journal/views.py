from uuid import UUID

from django.http import StreamingHttpResponse
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.views import APIView

from config.openapi import MAX_QUERY_INT
from journal.access import viewable_saga
from journal.export import iter_jsonl


def cursor_param(request: Request, name: str = "after") -> int:
    """A non-negative integer cursor from the query string; 0 when absent."""
    raw = request.query_params.get(name) or "0"
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_QUERY_INT:
        raise exceptions.ValidationError({name: ["Must be a non-negative integer."]})
    return int(raw)


class JournalExportApi(APIView):
    """`GET /api/v1/sagas/{id}/journal.jsonl`: the whole journal (or the part after `after`) as a download."""

    def get(self, request: Request, saga_id: UUID) -> StreamingHttpResponse:
        after = cursor_param(request)
        if viewable_saga(request.user, saga_id) is None:
            raise exceptions.NotFound(f"No saga {saga_id}.")
        response = StreamingHttpResponse(iter_jsonl(saga_id, after=after), content_type="application/x-ndjson")
        response["Content-Disposition"] = f'attachment; filename="saga-{saga_id}-journal.jsonl"'
        return response
