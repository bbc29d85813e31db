import os
from typing import Any

import anyio
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateways.mcp import operations
from gateways.mcp.server import build_server
from sagas import errors


class Command(BaseCommand):
    help = (
        "Serve Agora's collaboration tools over MCP on stdin/stdout, as the external agent whose API token is in "
        "the environment variable AGORA_TOKEN (or the one --token-env names)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--token-env", default="AGORA_TOKEN", help="The variable holding the agent's API token.")

    def handle(self, *args: Any, token_env: str, **options: Any) -> None:
        # The token is read from the environment, never from argv, which any local user can list.
        key = os.environ.get(token_env, "")
        try:
            operations.me(operations.principal(key))
        except errors.KernelError as exc:
            raise CommandError(f"{token_env}: {exc.detail}") from exc
        server = build_server(lambda ctx: key)
        # stdout carries the protocol: nothing else may be written there.
        anyio.run(server.run_stdio_async)
