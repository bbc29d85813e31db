"""Hook handlers and results in the admin, to read: handlers change only through `load_hooks`,
which checks each one, and results are what happened."""

from django.contrib import admin
from django.http import HttpRequest

from agents.hooks.models import HookHandler, HookResult


@admin.register(HookHandler)
class HookHandlerAdmin(admin.ModelAdmin):
    list_display = ("name", "brain", "event", "matcher", "type", "timeout_s", "updated_at")
    list_filter = ("event", "type", "brain")
    search_fields = ("name", "brain", "matcher")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: HookHandler | None = None) -> bool:
        return False


@admin.register(HookResult)
class HookResultAdmin(admin.ModelAdmin):
    list_display = ("key", "handler", "event", "status", "duration_ms", "created_at")
    list_filter = ("event", "status")
    search_fields = ("=key", "handler")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: HookResult | None = None) -> bool:
        return False
