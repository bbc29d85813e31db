"""MCP servers whose tools agents may use: rows, editable in the admin and loadable from the profiles file."""

import math
import os
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

# Offered tool names are `<server>__<tool>`: OpenAI function names allow only [A-Za-z0-9_-] (no dots)
# up to 64 characters, so a server's name has no underscore and the first `__` splits the two.
SERVER_NAME_RE = r"^[a-z0-9][a-z0-9-]{0,23}$"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REFERENCE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class McpServer(models.Model):
    """One MCP server: how to reach it, which of its tools agents may call, and how long to wait.

    Credentials are never stored here: `env` maps each variable the stdio server gets to the name of
    a variable of the worker's environment, and a header value may only take secrets from there, as
    `${NAME}` references.
    """

    class Transport(models.TextChoices):
        STDIO = "stdio"
        HTTP = "http", "streamable HTTP"

    name = models.CharField(
        max_length=24, unique=True, validators=[RegexValidator(SERVER_NAME_RE, "Lower-case letters, digits and -.")]
    )
    transport = models.CharField(max_length=8, choices=Transport.choices)
    command = models.CharField(max_length=500, blank=True, help_text="stdio: the executable.")
    args = models.JSONField(default=list, blank=True, help_text="stdio: its arguments, a list of strings.")
    env = models.JSONField(
        default=dict, blank=True, help_text='stdio: {"VAR_IT_GETS": "WORKER_ENV_VAR"}, values read at connection.'
    )
    url = models.URLField(max_length=500, blank=True, help_text="streamable HTTP: the endpoint.")
    headers = models.JSONField(
        default=dict, blank=True, help_text='HTTP headers; secrets as ${WORKER_ENV_VAR}, e.g. "Bearer ${GH_TOKEN}".'
    )
    allowed_tools = models.JSONField(default=list, help_text='The tools agents may call; ["*"] for all of them.')
    connect_timeout_s = models.FloatField(default=10.0)
    call_timeout_s = models.FloatField(default=30.0)
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problems: dict[str, str] = {}
        if self.transport == self.Transport.STDIO and not self.command:
            problems["command"] = "A stdio server needs a command."
        if self.transport == self.Transport.HTTP and not self.url:
            problems["url"] = "An HTTP server needs a URL."
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            problems["args"] = "A list of strings."
        if not isinstance(self.env, dict) or not all(
            isinstance(v, str) and ENV_NAME_RE.match(k) and ENV_NAME_RE.match(v) for k, v in self.env.items()
        ):
            problems["env"] = "Variable names to variable names of the worker's environment (never values)."
        if not isinstance(self.headers, dict) or not all(isinstance(v, str) for v in self.headers.values()):
            problems["headers"] = "Header names to strings."
        elif any(k.lower() in SECRET_HEADERS and not REFERENCE_RE.search(v) for k, v in self.headers.items()):
            problems["headers"] = "Take credentials from the environment: ${VAR}, never in clear."
        if not isinstance(self.allowed_tools, list) or not all(isinstance(t, str) for t in self.allowed_tools):
            problems["allowed_tools"] = 'A list of tool names, or ["*"].'
        if not all(positive(t) for t in (self.connect_timeout_s, self.call_timeout_s)):
            problems["call_timeout_s"] = "Timeouts are positive numbers of seconds."
        if problems:
            raise ValidationError(problems)

    def allows(self, tool: str) -> bool:
        return "*" in self.allowed_tools or tool in self.allowed_tools

    def child_env(self) -> dict[str, str]:
        """The stdio server's variables, read from the worker's environment now (missing ones are left out)."""
        return {name: os.environ[source] for name, source in self.env.items() if source in os.environ}

    def resolved_headers(self) -> dict[str, str]:
        return {
            name: REFERENCE_RE.sub(lambda m: os.environ.get(m.group(1), ""), value)
            for name, value in self.headers.items()
        }

    def as_config(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self._meta.fields if f.name not in ("id", "updated_at")}


SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}


def positive(value: Any) -> bool:
    """A number of seconds: finite and above zero (a field that did not take its value holds it raw)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
