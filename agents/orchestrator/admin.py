"""Brains are edited in the admin like profiles; prompts are shown, never edited (their steps are
the orchestrator's)."""

import json

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from agents.orchestrator.models import Brain, Prompt
from config.admin_lists import ListsAdmin


@admin.register(Brain)
class BrainAdmin(ListsAdmin):
    """Its form validates through `Brain.clean`, the checks `load_brains` applies: a brain that would
    not route (a signal that does not compile) or not delegate (a profile that does not exist) is
    refused with the field's error, not saved."""

    list_display = ("name", "planner_profile", "default_primary", "max_parallel_agents", "review_policy", "updated_at")
    search_fields = ("name",)


@admin.register(Prompt)
class PromptAdmin(ListsAdmin):
    list_display = ("id", "saga", "brain", "status", "step", "created_at")
    list_filter = ("status", "step")
    search_fields = ("=id", "text")
    fields = ("id", "saga", "brain", "lead", "status", "step", "text", "team", "pretty_plan", "pretty_results",
              "answer", "pretty_review", "final_answer", "reason", "created_at", "updated_at")  # fmt: skip
    readonly_fields = fields

    @admin.display(description="plan")
    def pretty_plan(self, prompt: Prompt) -> str:
        return format_html("<pre>{}</pre>", json.dumps(prompt.plan, indent=2, ensure_ascii=False))

    @admin.display(description="results")
    def pretty_results(self, prompt: Prompt) -> str:
        return format_html("<pre>{}</pre>", json.dumps(prompt.results, indent=2, ensure_ascii=False))

    @admin.display(description="review")
    def pretty_review(self, prompt: Prompt) -> str:
        return format_html("<pre>{}</pre>", json.dumps(prompt.review, indent=2, ensure_ascii=False))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Prompt | None = None) -> bool:
        return False
