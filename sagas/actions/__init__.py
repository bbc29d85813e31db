"""The kernel's writes, by concern. Each action locks its saga (`locking`), changes state, journals
it in the same transaction, and rings doorbells only after commit. Callers import from here."""

from sagas.actions.artifacts import add_artifact
from sagas.actions.collaborators import NewAgent, add_agent, add_agents, add_human, find_collaborator
from sagas.actions.exposure import set_exposed
from sagas.actions.human_forms import answer_human_request, ask_human, visible_human_request
from sagas.actions.lifecycle import create_saga
from sagas.actions.locking import saga_transaction
from sagas.actions.requests import (
    ask_agent,
    cancel_request,
    due_expiry_ids,
    due_wait_ids,
    end_wait,
    expire_request,
    get_request_for,
    outcome,
    reply_to_request,
)
from sagas.actions.runs import (
    claim_turn,
    end_turn,
    finish_run,
    park_on_request,
    queued_run,
    reclaim_lapsed_turn,
    renew_lease,
    set_external_status,
    take_turn,
)
from sagas.actions.steering import consume_steering, steer
from sagas.actions.teams import (
    broadcast,
    configure_team,
    find_teammate,
    idle_teammate_ids,
    lead_inbox,
    roster,
    shut_down_idle,
    shutdown_team,
    shutdown_teammate,
    spawn_teammate,
    team_of,
    visible_team,
)
from sagas.actions.tokens import revoke_agent_token, rotate_agent_token

__all__ = [
    "NewAgent",
    "add_agent",
    "add_agents",
    "add_artifact",
    "add_human",
    "answer_human_request",
    "ask_agent",
    "ask_human",
    "broadcast",
    "cancel_request",
    "claim_turn",
    "configure_team",
    "consume_steering",
    "create_saga",
    "due_expiry_ids",
    "due_wait_ids",
    "end_turn",
    "end_wait",
    "expire_request",
    "find_collaborator",
    "find_teammate",
    "finish_run",
    "get_request_for",
    "idle_teammate_ids",
    "lead_inbox",
    "outcome",
    "park_on_request",
    "queued_run",
    "reclaim_lapsed_turn",
    "renew_lease",
    "reply_to_request",
    "revoke_agent_token",
    "roster",
    "rotate_agent_token",
    "saga_transaction",
    "set_exposed",
    "set_external_status",
    "shut_down_idle",
    "shutdown_team",
    "shutdown_teammate",
    "spawn_teammate",
    "steer",
    "take_turn",
    "team_of",
    "visible_human_request",
    "visible_team",
]
