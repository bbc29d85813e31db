"""What every admin list of the project shares."""

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest


class CheckedLookups(ChangeList):
    """A date's part in the query string past what a date holds (`?created_at__year=` and twenty
    digits) is a bad lookup, as one that is not a number is: the admin's own "invalid lookup"
    answer. Django catches only ValueError where it reads a date hierarchy's parts, and a plain
    lookup's number fails when the list is counted: both were a 500."""

    def get_filters(self, request: HttpRequest) -> Any:
        try:
            return super().get_filters(request)
        except OverflowError as exc:
            raise IncorrectLookupParameters(exc) from exc

    def get_results(self, request: HttpRequest) -> None:
        try:
            super().get_results(request)
        except OverflowError as exc:
            raise IncorrectLookupParameters(exc) from exc


class ListsAdmin(admin.ModelAdmin):
    """A model's admin whose list reads its lookups as CheckedLookups does."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckedLookups
