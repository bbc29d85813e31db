import json

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from config.admin_lists import ListsAdmin
from journal.models import JournalEvent


@admin.register(JournalEvent)
class JournalEventAdmin(ListsAdmin):
    """For inspection only: the journal is append-only and written by `journal.actions.record`."""

    list_display = ("saga", "seq", "type", "actor", "run_id", "created_at")
    list_filter = ("type", "actor", ("created_at", admin.DateFieldListFilter), "saga")
    search_fields = ("type", "actor", "run_id", "saga__title", "=saga__id")
    list_select_related = ("saga",)
    date_hierarchy = "created_at"
    fields = ("saga", "seq", "type", "actor", "run_id", "created_at", "pretty_data")
    readonly_fields = fields
    show_full_result_count = False

    @admin.display(description="data")
    def pretty_data(self, event: JournalEvent) -> str:
        return format_html("<pre>{}</pre>", json.dumps(event.data, indent=2, ensure_ascii=False, sort_keys=True))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: JournalEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: JournalEvent | None = None) -> bool:
        return False
