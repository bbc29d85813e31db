"""The router model call: the brain's planner profile, its explicit fallback chain, each attempt
journaled as the turn executor journals its own (`llm_call`, `model_fallback`, `model_skipped`).
Outside any transaction; a routing step that runs again simply asks again."""

import time
from typing import Any

from agents.images import VISION, for_request, with_images
from agents.models import AgentProfile, profile_named
from agents.providers import ProviderError, provider_for
from journal.actions import record


def vision_roles(roles: dict[str, str]) -> set[str]:
    """The roles whose own model chain holds a candidate that can see images (and has what else its
    profile requires: the only candidates a worker of a prompt with images runs on)."""
    profiles = {p.name: p for p in AgentProfile.objects.filter(name__in=set(roles.values()))}
    return {
        role
        for role, name in roles.items()
        if (p := profiles.get(name)) is not None and any(not p.lacks(m, also=[VISION]) for m in p.candidates)
    }


def ask_router(*, profile_name: str, text: str, saga_id: Any, actor: str, images: list[str]) -> tuple[str | None, str]:
    """(the router's text, "") or (None, why there is none). A prompt's `images` go with the
    request, and only to candidates that can see them."""
    profile = profile_named(profile_name)
    if profile is None:
        return None, f"no planner profile {profile_name!r}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": profile.system_prompt or "You route requests to specialist agents."},
        {"role": "user", "content": with_images(text, images)},
    ]
    sent: list[dict[str, Any]] = []  # as sent: made for the first candidate that may be asked
    errors = []
    for model in profile.candidates:
        if lacks := profile.lacks(model, also=[VISION] if images else []):
            record(
                saga_id=saga_id,
                type="model_skipped",
                actor=actor,
                data={"role": "router", "model": model, "lacks": lacks},
            )
            continue
        sent = sent or for_request(messages, saga_id=saga_id)
        started = time.perf_counter()
        try:
            completion = provider_for(model, profile.endpoint).complete(model=model, messages=sent, tools=[])
        except ProviderError as exc:
            record(
                saga_id=saga_id,
                type="model_fallback",
                actor=actor,
                data={"role": "router", "model": model, "error_class": exc.error_class, "retryable": exc.retryable,
                      "error": str(exc)[:500]},
            )  # fmt: skip
            errors.append(f"{model}: {exc.error_class}")
            continue
        record(
            saga_id=saga_id,
            type="llm_call",
            actor=actor,
            data={"role": "router", "model": completion.model,
                  "latency_ms": round((time.perf_counter() - started) * 1000, 1),
                  "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
                  "tool_calls": []},
        )  # fmt: skip
        return completion.content, ""
    return None, "every router candidate failed" + (f" ({'; '.join(errors)})" if errors else "")
