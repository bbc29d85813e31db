"""Agora as an MCP server: `manage.py mcp_server` (stdio) and the streamable HTTP endpoint `/mcp`."""
