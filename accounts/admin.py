from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from accounts.models import ApiToken, User
from config.admin_lists import ListsAdmin


@admin.register(User)
class UserAdmin(ListsAdmin, BaseUserAdmin):
    list_display = ("username", "kind", "email", "is_staff", "is_active")
    list_filter = ("kind", "is_staff", "is_active")
    fieldsets = (*(BaseUserAdmin.fieldsets or ()), ("Agora", {"fields": ("kind",)}))


@admin.register(ApiToken)
class ApiTokenAdmin(ListsAdmin):
    list_display = ("prefix", "user", "created_at")
    search_fields = ("user__username", "prefix")
    readonly_fields = ("user", "key_hash", "prefix", "created_at")

    def has_add_permission(self, request: object) -> bool:
        return False  # tokens are issued through the API, which shows the key once
