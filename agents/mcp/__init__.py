"""Agents use tools from MCP servers: server rows (`models`), this process's connections
(`connections`) and the tools of a run's turns (`runtime`)."""
