"""The five lifecycle events and what each one may do (DESIGN.md §7, the seed's hooks table)."""

from dataclasses import dataclass
from enum import StrEnum


class Event(StrEnum):
    SESSION_START = "SessionStart"
    USER_PROMPT_SUBMIT = "UserPromptSubmit"
    SUBAGENT_START = "SubagentStart"
    SUBAGENT_STOP = "SubagentStop"
    STOP = "Stop"


@dataclass(frozen=True)
class Rules:
    journal_type: str
    may_block: bool
    adds_context: bool  # through `{"additional_context": …}`
    plain_text_is_context: bool  # plain stdout (not JSON) counts as context


RULES: dict[Event, Rules] = {
    Event.SESSION_START: Rules("hook_session_start", may_block=True, adds_context=True, plain_text_is_context=True),
    Event.USER_PROMPT_SUBMIT: Rules(
        "hook_user_prompt_submit", may_block=True, adds_context=True, plain_text_is_context=True
    ),
    Event.SUBAGENT_START: Rules("hook_subagent_start", may_block=True, adds_context=True, plain_text_is_context=True),
    Event.SUBAGENT_STOP: Rules("hook_subagent_stop", may_block=False, adds_context=False, plain_text_is_context=False),
    # Stop's context is feedback appended to the answer; only an explicit JSON field gives it.
    Event.STOP: Rules("hook_stop", may_block=False, adds_context=True, plain_text_is_context=False),
}
