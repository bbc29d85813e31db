"""What the OpenAPI document (drf-spectacular) needs beyond the views' own annotations."""

from typing import Any

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.views import APIView

from config.openapi import MAX_QUERY_INT, problems

AFTER = {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_INT}


class JournalExportSchema(OpenApiViewExtension):
    """The JSONL export (journal.views) streams lines of journal events rather than one JSON document."""

    target_class = "journal.views.JournalExportApi"

    def view_replacement(self) -> type[APIView]:
        export: type[APIView] = self.target

        class Annotated(export):  # type: ignore[valid-type,misc]
            @extend_schema(
                operation_id="journal_export",
                parameters=[OpenApiParameter("after", AFTER, description="Events with a greater seq.")],
                responses={
                    (200, "application/x-ndjson"): OpenApiResponse(
                        OpenApiTypes.STR, description="One journal event per line, in seq order."
                    ),
                    **problems(400, 401, 404),
                },
            )
            def get(self, *args: Any, **kwargs: Any) -> Any:
                return super().get(*args, **kwargs)

        return Annotated
