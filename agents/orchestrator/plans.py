"""Routing: the deterministic heuristic, the router's strict-JSON answer normalized against it, and
the forced-roles plan. Pure functions over a brain's configuration; the plan shape is the seed's
AgentRoutingPlan: `{primary_role, workers: [{role, goal, reason}], requires_review, reason}`, plus
which path produced it (`source`), why the router's answer was not used (`router_error`) and which
roles' signals took too long to match (`signals_timed_out`)."""

import json
import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import regex
from django.conf import settings

from config.payloads import storable_value

logger = logging.getLogger(__name__)

Plan = dict[str, Any]
RESERVED_SLOTS = ("primary", "review")


@dataclass(frozen=True)
class Routing:
    """What routing may choose from: the brain's roles (those allowed for this prompt), its
    signals, its review role and its cap."""

    brain: str
    roles: tuple[str, ...]
    signals: dict[str, list[str]]
    default_primary: str
    review_role: str
    review_by_default: bool
    max_workers: int

    @classmethod
    def of(cls, brain: Any, *, allowed: Collection[str] | None = None) -> "Routing":
        roles = tuple(r for r in brain.roles if allowed is None or r in allowed)
        review = brain.review_role if brain.review_role in roles else ""
        support = [r for r in roles if r != review]  # a stand-in primary is one of them, not the reviewer
        return cls(
            brain=brain.name,
            roles=roles,
            signals={r: list(brain.signals.get(r, [])) for r in roles},
            default_primary=brain.default_primary if brain.default_primary in roles else next(iter(support), ""),
            review_role=review,
            review_by_default=brain.review_by_default,
            max_workers=max(0, int(brain.max_parallel_agents)),
        )

    @property
    def support_roles(self) -> tuple[str, ...]:
        return tuple(r for r in self.roles if r != self.review_role)


def default_goal(role: str, primary: str) -> str:
    return f"Give the {primary} agent what the {role} perspective adds to this request."


def signal_matches(pattern: str, text: str, routing: Routing, role: str) -> bool | None:
    """Whether the signal is found in the prompt; None if it took longer than a signal may (a
    pattern that backtracks without end on some text would hold the routing task for ever)."""
    try:
        return regex.search(pattern, text, regex.IGNORECASE, timeout=settings.AGORA_SIGNAL_TIMEOUT_S) is not None
    except TimeoutError:
        logger.warning(
            "Brain %r, role %r: the signal %r took too long to match a prompt.", routing.brain, role, pattern
        )
        return None
    except regex.error as exc:  # saved while `re` read the signals: Brain.clean() refuses it since
        logger.warning("Brain %r, role %r: the signal %r does not compile: %s", routing.brain, role, pattern, exc)
        return False


def heuristic_plan(text: str, routing: Routing) -> Plan:
    """Roles whose signals match the prompt, strongest first; the strongest is the primary and the
    others (up to the cap) support it. Nothing matching: the brain's default primary alone. A
    signal that runs out of time counts as no match, and the plan names its role."""
    scores: list[tuple[int, int, str, list[str]]] = []
    timed_out: list[str] = []
    for order, role in enumerate(routing.roles):
        found = [(p, signal_matches(p, text, routing, role)) for p in routing.signals.get(role, [])]
        if any(hit is None for _, hit in found):
            timed_out.append(role)
        if hits := [p for p, hit in found if hit]:
            scores.append((-len(hits), order, role, hits))
    scores.sort()
    matched = [(role, hits) for _, _, role, hits in scores]
    candidates = [(r, h) for r, h in matched if r != routing.review_role]
    primary = candidates[0][0] if candidates else routing.default_primary
    workers = [
        {"role": role, "goal": default_goal(role, primary), "reason": "signals: " + ", ".join(hits)}
        for role, hits in candidates
        if role != primary
    ][: routing.max_workers]
    review_hit = any(r == routing.review_role for r, _ in matched)
    requires_review = bool(routing.review_role) and (routing.review_by_default or review_hit)
    reason = f"{primary} matched " + ", ".join(candidates[0][1]) if candidates else "no signal matched"
    plan: Plan = {
        "primary_role": primary,
        "workers": workers,
        "requires_review": requires_review,
        "reason": reason,
        "source": "heuristic",
    }
    if timed_out:
        plan["signals_timed_out"] = timed_out
    return plan


def router_prompt(text: str, routing: Routing, *, has_images: bool = False) -> str:
    """The strict-JSON request to the router model; the roles it may name are listed inline."""
    shape = {
        "primary_role": "|".join(routing.support_roles),
        "workers": [{"role": "|".join(routing.support_roles), "goal": "string", "reason": "string"}],
        "requires_review": True,
        "reason": "string",
    }
    return (
        "Route this request to specialist agents. Answer with one JSON object and nothing else, of this shape:\n"
        f"{json.dumps(shape)}\n"
        f"Support workers run in parallel before the primary; at most {routing.max_workers} of them. "
        f"Set requires_review when the answer should pass a review by the {routing.review_role or 'review'} agent."
        + (" The request carries images: only the roles listed can see them." if has_images else "")
        + f"\n\nRequest:\n{text}"
    )


def parse_json_object(text: str) -> dict[str, Any] | None:
    """A JSON object from a model's text: bare, or inside a ``` fence."""
    candidates = [text.strip()]
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        candidates.append(fenced.group(1).strip())
    for candidate in candidates:
        try:
            value = storable_value(json.loads(candidate))  # its escapes may spell a NUL or half an emoji
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
            continue
        if isinstance(value, dict):
            return value
    return None


def normalize_router_decision(answer: str | None, routing: Routing, fallback: Plan, *, error: str = "") -> Plan:
    """The router's answer validated against the brain: unknown roles are dropped, workers capped,
    and anything unusable (no answer, not JSON, no known primary) gives the heuristic plan with
    the reason recorded."""
    if answer is None:
        return {**fallback, "router_error": error or "the router gave no answer"}
    decision = parse_json_object(answer)
    if decision is None:
        return {**fallback, "router_error": "the router's answer is not a JSON object"}
    primary = decision.get("primary_role")
    if primary not in routing.support_roles:
        return {**fallback, "router_error": f"unknown primary role {primary!r}"}
    raw_workers = decision.get("workers", [])
    if not isinstance(raw_workers, list):
        return {**fallback, "router_error": "workers is not a list"}
    workers: list[dict[str, str]] = []
    dropped: list[str] = []
    for entry in raw_workers:
        role = entry.get("role") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or role not in routing.support_roles or role == primary:
            dropped.append(str(role if isinstance(entry, dict) else entry))
            continue
        if any(w["role"] == role for w in workers):
            continue  # one worker per role
        goal, why = entry.get("goal"), entry.get("reason")
        workers.append(
            {
                "role": role,
                "goal": goal.strip() if isinstance(goal, str) and goal.strip() else default_goal(role, primary),
                "reason": why.strip() if isinstance(why, str) else "",
            }
        )
    over = [w["role"] for w in workers[routing.max_workers :]]
    review = decision.get("requires_review")
    plan: Plan = {
        "primary_role": primary,
        "workers": workers[: routing.max_workers],
        "requires_review": bool(routing.review_role)
        and (review if isinstance(review, bool) else fallback["requires_review"]),
        "reason": str(decision.get("reason") or ""),
        "source": "router",
    }
    if dropped:
        plan["dropped"] = dropped
    if over:
        plan["over_cap"] = over
    if "signals_timed_out" in fallback:
        plan["signals_timed_out"] = fallback["signals_timed_out"]
    return plan


def forced_plan(team: list[str]) -> Plan:
    """Forced roles: each answers independently, the first is the primary, no router, no review."""
    return {
        "primary_role": team[0],
        "workers": [
            {"role": role, "goal": f"Answer independently as the {role} agent.", "reason": "forced role"}
            for role in team
        ],
        "requires_review": False,
        "reason": "forced roles",
        "source": "team",
    }
