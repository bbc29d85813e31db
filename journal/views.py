from uuid import UUID

from django.http import StreamingHttpResponse
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.views import APIView

from config.params import integer_param
from journal.access import reader_filter, viewable_saga
from journal.export import aiter_jsonl, iter_jsonl


class JournalExportApi(APIView):
    """`GET /api/v1/sagas/{id}/journal.jsonl`: the whole journal (or the part after `after`) as a download."""

    def get(self, request: Request, saga_id: UUID) -> StreamingHttpResponse:
        after = integer_param(request.query_params, "after", default=0)
        saga = viewable_saga(request.user, saga_id)
        if saga is None:
            raise exceptions.NotFound(f"No saga {saga_id}.")
        lens = reader_filter(request.user, saga)
        # Under ASGI (daphne) an async iterator: a sync one Django would read whole before the first byte.
        served_async = hasattr(request._request, "scope")
        lines = (aiter_jsonl if served_async else iter_jsonl)(saga_id, lens=lens, after=after)
        response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
        response["Content-Disposition"] = f'attachment; filename="saga-{saga_id}-journal.jsonl"'
        return response
