"""The kernel in the admin: for inspection. Every row links to its saga's page and journal.

Nothing here writes: every change to these models goes through `sagas.actions`, which checks
access and journals it in the same transaction. An edit form would do neither, so these admins are
view-only, and history (steering, answered forms, finished requests) can never be rewritten here.
"""

import json
from typing import Any
from uuid import UUID

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from config.admin_lists import ListsAdmin
from sagas.models import (
    AgentRequest,
    Broadcast,
    Collaborator,
    Delegation,
    HumanRequest,
    RemoteAgent,
    RemoteCall,
    Run,
    Saga,
    SteeringItem,
    Team,
)


def journal_url(saga_id: UUID) -> str:
    return f"{reverse('admin:journal_journalevent_changelist')}?saga__id__exact={saga_id}"


def saga_links(saga_id: UUID) -> SafeString:
    return format_html(
        '<a href="{}">page</a> · <a href="{}">journal</a>',
        reverse("sagas:detail", args=[saga_id]),
        journal_url(saga_id),
    )


def pretty_json(value: Any) -> SafeString:
    return format_html(
        '<pre style="margin:0;white-space:pre-wrap">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False)
    )


class ReadOnlyAdmin(ListsAdmin):
    """View-only: inspect, filter, search, follow links; never add, edit or delete."""

    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="saga")
    def saga_links(self, obj: Any) -> SafeString:
        return saga_links(obj.saga_id)


class CollaboratorInline(admin.TabularInline):
    model = Collaborator
    fields = ("handle_", "role", "runtime", "profile", "task", "joined_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    @admin.display(description="collaborator")
    def handle_(self, collaborator: Collaborator) -> str:
        return collaborator.handle

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Saga)
class SagaAdmin(ReadOnlyAdmin):
    list_display = ("title", "status", "policy", "owner", "members", "created_at", "links")
    list_filter = ("status", "policy", ("created_at", admin.DateFieldListFilter))
    search_fields = ("title", "goal", "owner__username", "=id")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
    fields = ("id", "title", "goal", "owner", "status", "policy", "created_at", "links")
    readonly_fields = fields
    inlines = [CollaboratorInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Saga]:
        return super().get_queryset(request).annotate(member_count=Count("collaborators"))

    @admin.display(description="collaborators", ordering="member_count")
    def members(self, saga: Any) -> int:
        return int(getattr(saga, "member_count", 0))

    @admin.display(description="open")
    def links(self, saga: Saga) -> SafeString:
        return saga_links(saga.pk)


@admin.register(Collaborator)
class CollaboratorAdmin(ReadOnlyAdmin):
    list_display = ("handle", "saga", "kind", "role", "runtime", "profile", "run_status", "joined_at", "saga_links")
    list_filter = ("kind", "runtime", "run__status")
    search_fields = ("name", "role", "task", "profile", "saga__title", "=saga__id", "user__username")
    list_select_related = ("saga", "run")
    fields = ("saga", "kind", "name", "role", "task", "user", "runtime", "profile", "steering_seq", "joined_at")
    readonly_fields = fields

    @admin.display(description="run", ordering="run__status")
    def run_status(self, collaborator: Collaborator) -> str:
        run = getattr(collaborator, "run", None)
        return run.status if run else "—"


@admin.register(Delegation)
class DelegationAdmin(ReadOnlyAdmin):
    list_display = ("delegator", "delegate", "saga", "status", "created_at", "saga_links")
    list_filter = ("status",)
    search_fields = ("delegator__name", "delegate__name", "task", "saga__title", "=saga__id")
    list_select_related = ("saga", "delegator", "delegate")
    fields = ("saga", "delegator", "delegate", "task", "status", "created_at")
    readonly_fields = fields


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "collaborator", "saga", "status", "turn", "lease_until", "wait_until", "updated_at", "links")
    list_filter = ("status", "resumable", "collaborator__runtime")
    search_fields = ("=id", "collaborator__name", "collaborator__saga__title", "=collaborator__saga__id")
    list_select_related = ("collaborator__saga",)
    fields = (
        "id", "collaborator", "status", "turn", "resumable", "lease_until", "waiting_on",
        "wait_until", "wait_tool_call_id", "result_", "error", "created_at", "updated_at",
    )  # fmt: skip
    readonly_fields = fields

    @admin.display(description="saga")
    def saga(self, run: Run) -> Saga:
        return run.collaborator.saga

    @admin.display(description="open")
    def links(self, run: Run) -> SafeString:
        return saga_links(run.collaborator.saga_id)

    @admin.display(description="result")
    def result_(self, run: Run) -> SafeString:
        return pretty_json(run.result)


@admin.register(AgentRequest)
class AgentRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "type", "sender", "recipient", "mode", "status", "hop", "created_at", "saga_links")
    list_filter = ("status", "mode", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=id", "type", "sender__name", "recipient__name", "idempotency_key", "=saga__id", "saga__title")
    list_select_related = ("sender", "recipient")
    date_hierarchy = "created_at"
    fields = (
        "id", "saga", "sender", "recipient", "type", "mode", "status", "hop", "payload_", "reply_", "error_",
        "idempotency_key", "wait_deadline", "expires_at", "created_at", "updated_at",
    )  # fmt: skip
    readonly_fields = fields

    @admin.display(description="payload")
    def payload_(self, request: AgentRequest) -> SafeString:
        return pretty_json(request.payload)

    @admin.display(description="reply")
    def reply_(self, request: AgentRequest) -> SafeString:
        return pretty_json(request.reply)

    @admin.display(description="error")
    def error_(self, request: AgentRequest) -> SafeString:
        return pretty_json(request.error)


@admin.register(SteeringItem)
class SteeringItemAdmin(ReadOnlyAdmin):
    list_display = ("recipient", "seq", "kind", "sender", "request", "consumed_turn", "consumed_at", "created_at")
    list_filter = ("kind", ("consumed_at", admin.EmptyFieldListFilter))
    search_fields = ("recipient__name", "sender", "=request__id", "=human_request__id", "=recipient__saga__id")
    list_select_related = ("recipient",)
    fields = (
        "recipient", "seq", "kind", "sender", "request", "human_request", "payload_", "consumed_turn",
        "consumed_at", "created_at", "links",
    )  # fmt: skip
    readonly_fields = fields

    @admin.display(description="payload")
    def payload_(self, item: SteeringItem) -> SafeString:
        return pretty_json(item.payload)

    @admin.display(description="saga")
    def links(self, item: SteeringItem) -> SafeString:
        return saga_links(item.recipient.saga_id)


@admin.register(HumanRequest)
class HumanRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "title", "asker", "addressee", "status", "created_at", "answered_at", "saga_links")
    list_filter = ("status", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=id", "title", "asker__name", "addressee__name", "=saga__id", "saga__title")
    list_select_related = ("asker", "addressee")
    fields = (
        "id", "saga", "asker", "addressee", "title", "status", "fields_", "answer_", "answered_by",
        "created_at", "answered_at",
    )  # fmt: skip
    readonly_fields = fields

    @admin.display(description="fields")
    def fields_(self, human_request: HumanRequest) -> SafeString:
        return pretty_json(human_request.fields)

    @admin.display(description="answer")
    def answer_(self, human_request: HumanRequest) -> SafeString:
        return pretty_json(human_request.answer)


@admin.register(Team)
class TeamAdmin(ReadOnlyAdmin):
    """Budgets change through `configure_team` (PATCH /api/v1/sagas/{id}/teams/{lead}/), journaled."""

    list_display = (
        "lead", "saga", "max_teammates", "max_tokens", "tokens_used", "idle_timeout_s", "created_at", "saga_links",
    )  # fmt: skip
    search_fields = ("lead__name", "saga__title", "=saga__id")
    list_select_related = ("lead", "saga")
    fields = ("saga", "lead", "max_teammates", "max_tokens", "tokens_used", "idle_timeout_s", "created_at")
    readonly_fields = fields


@admin.register(Broadcast)
class BroadcastAdmin(ReadOnlyAdmin):
    list_display = ("id", "team", "sender", "created_at")
    search_fields = ("=id", "team__lead__name", "sender")
    list_select_related = ("team__lead",)
    fields = ("id", "team", "sender", "content", "recipients", "idempotency_key", "created_at")
    readonly_fields = fields


@admin.register(RemoteAgent)
class RemoteAgentAdmin(ReadOnlyAdmin):
    """Allowed and removed by the saga's managers (page or REST), journaled; never edited here."""

    list_display = ("name", "url", "token_env", "added_by", "created_at", "saga_links")
    search_fields = ("name", "url", "=saga__id", "saga__title")
    fields = ("saga", "name", "url", "token_env", "added_by", "created_at")
    readonly_fields = fields


@admin.register(RemoteCall)
class RemoteCallAdmin(ReadOnlyAdmin):
    list_display = ("id", "caller", "agent_name", "mode", "status", "attempts", "created_at", "saga_links")
    list_filter = ("status", "mode", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=id", "agent_name", "url", "=task_id", "caller__name", "=saga__id")
    list_select_related = ("caller",)
    date_hierarchy = "created_at"
    fields = (
        "id", "saga", "caller", "agent_name", "url", "mode", "status", "task_id", "context_id", "message_",
        "reply_", "error_", "idempotency_key", "deadline", "attempts", "failures", "step", "next_step_at",
        "lease_until", "created_at", "updated_at",
    )  # fmt: skip
    readonly_fields = fields

    @admin.display(description="message")
    def message_(self, call: RemoteCall) -> SafeString:
        return pretty_json(call.message)

    @admin.display(description="reply")
    def reply_(self, call: RemoteCall) -> SafeString:
        return pretty_json(call.reply)

    @admin.display(description="error")
    def error_(self, call: RemoteCall) -> SafeString:
        return pretty_json(call.error)
