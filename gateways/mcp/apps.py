from django.apps import AppConfig


class McpGatewayConfig(AppConfig):
    name = "gateways.mcp"
    label = "mcp_gateway"
    verbose_name = "MCP gateway"
