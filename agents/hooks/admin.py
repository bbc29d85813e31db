"""Hook handlers and results in the admin, to read: handlers change only through `load_hooks`,
which checks each one, and results are what happened."""

from django.contrib import admin
from django.http import HttpRequest

from agents.hooks.models import HookHandler, HookResult
from config.admin_lists import ListsAdmin


@admin.register(HookHandler)
class HookHandlerAdmin(ListsAdmin):
    list_display = ("name", "brain", "event", "matcher", "type", "timeout_s", "updated_at")
    list_filter = ("event", "type", "brain")
    search_fields = ("name", "brain", "matcher")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: HookHandler | None = None) -> bool:
        return False


@admin.register(HookResult)
class HookResultAdmin(ListsAdmin):
    list_display = ("key", "handler", "event", "status", "duration_ms", "created_at")
    list_filter = ("event", "status")
    search_fields = ("=key", "handler")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: HookResult | None = None) -> bool:
        return False
