"""Small presentation helpers for the dashboard templates."""

from datetime import datetime
from typing import Any
from uuid import uuid4

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from config.params import FORM_KEY
from journal.models import JournalEvent
from sagas import dashboard
from sagas.models import Collaborator

register = template.Library()


@register.simple_tag
def badge(status: str, label: str = "") -> SafeString:
    """A status pill; its colour comes from the status name (see agora.css, `.badge-<status>`)."""
    text = label or str(status).replace("_", " ")
    return format_html('<span class="badge badge-{}"><i></i>{}</span>', str(status), text)


@register.simple_tag
def form_key() -> SafeString:
    """A form's hidden one-time key (config.params.form_key): a new one each time the page renders."""
    return format_html('<input type="hidden" name="{}" value="{}">', FORM_KEY, uuid4().hex)


@register.filter
def a2a_card(collaborator: Collaborator, base_url: str) -> str:
    return dashboard.a2a_card_url(base_url, collaborator)


@register.filter
def describe(event: JournalEvent) -> str:
    return dashboard.describe(event)


@register.filter
def tone(event_type: str) -> str:
    return dashboard.event_tone(event_type)


@register.filter
def short(value: Any, limit: int = 160) -> str:
    return dashboard.short(value, int(limit))


@register.filter
def pretty(value: Any) -> str:
    return dashboard.pretty(value)


@register.filter
def seconds(value: float | None) -> str:
    """A duration such as 0.4 s, 12 s or 3 min 5 s."""
    if value is None:
        return ""
    if value < 10:
        return f"{value:.1f} s"
    if value < 60:
        return f"{value:.0f} s"
    minutes, secs = divmod(int(value), 60)
    return f"{minutes} min {secs} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


@register.filter
def age(value: datetime | None) -> str:
    """How long ago, briefly: 12 s, 3 min, 5 h, 2 d."""
    if value is None:
        return ""
    elapsed = max(0, int((timezone.now() - value).total_seconds()))
    if elapsed < 60:
        return f"{elapsed} s"
    if elapsed < 3600:
        return f"{elapsed // 60} min"
    if elapsed < 86400:
        return f"{elapsed // 3600} h"
    return f"{elapsed // 86400} d"
