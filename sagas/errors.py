"""Kernel errors: each carries the stable code and HTTP status that the API reports."""

from config.problems import Problem


class KernelError(Problem):
    """A kernel rule refused the operation."""


def _error(name: str, code: str, status: int, title: str) -> type[KernelError]:
    return type(name, (KernelError,), {"code": code, "status": status, "title": title})


NotFound = _error("NotFound", "not_found", 404, "Not found")
Forbidden = _error("Forbidden", "forbidden", 403, "Forbidden")
NotAddressable = _error("NotAddressable", "not_addressable", 403, "Not addressable")
RecipientUnavailable = _error("RecipientUnavailable", "recipient_unavailable", 409, "Recipient unavailable")
Deadlock = _error("Deadlock", "deadlock", 409, "Deadlock")
HopLimit = _error("HopLimit", "hop_limit", 409, "Hop limit")
TooManyPending = _error("TooManyPending", "too_many_pending", 429, "Too many pending requests")
TooManyDelegates = _error("TooManyDelegates", "too_many_delegates", 429, "Too many delegates")
TooManyWaits = _error("TooManyWaits", "too_many_waits", 429, "Too many concurrent waits")
PayloadTooLarge = _error("PayloadTooLarge", "payload_too_large", 413, "Payload too large")
InvalidPayload = _error("InvalidPayload", "invalid_payload", 400, "Invalid payload")
AlreadyAnswered = _error("AlreadyAnswered", "already_answered", 409, "Already answered")
RequestCancelled = _error("RequestCancelled", "request_cancelled", 409, "Request cancelled")
IdempotencyConflict = _error("IdempotencyConflict", "idempotency_conflict", 409, "Idempotency conflict")
InvalidState = _error("InvalidState", "invalid_state", 409, "Invalid state")
NameTaken = _error("NameTaken", "name_taken", 409, "Name taken")
RequestClosed = _error("RequestClosed", "request_closed", 409, "Request closed")
NotTeamLead = _error("NotTeamLead", "not_team_lead", 403, "Not the team's lead")
TeamFull = _error("TeamFull", "team_full", 409, "Team full")
TeamBudgetExhausted = _error("TeamBudgetExhausted", "team_budget_exhausted", 409, "Team budget exhausted")
SagaFinished = _error("SagaFinished", "saga_finished", 409, "Saga finished")
RemoteNotAllowed = _error("RemoteNotAllowed", "remote_not_allowed", 403, "Remote agent not allowed")
