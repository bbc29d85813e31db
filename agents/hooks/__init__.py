"""Lifecycle hooks: trusted handlers (commands, webhooks, python callables) that the orchestrator
runs at five points of a prompt, and that may block it or add context. See the README's "Hooks and
artifacts" for the handler file and the interface."""

from agents.hooks.events import Event
from agents.hooks.lifecycle import PreparedPrompt, hook_key, prepare_prompt
from agents.hooks.runner import HookOutcome, HooksOutsideWorker, longest_run, run_hooks, stored_outcome

__all__ = [
    "Event",
    "HookOutcome",
    "HooksOutsideWorker",
    "PreparedPrompt",
    "hook_key",
    "longest_run",
    "prepare_prompt",
    "run_hooks",
    "stored_outcome",
]
