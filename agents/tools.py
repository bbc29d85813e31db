"""The tools offered to models (DESIGN.md §6), each bound to a kernel action.

Every tool runs inside the transaction that also stores its result in the transcript, with the
idempotency key (run, tool call id): after a crash a call either happened with its result stored,
or not at all.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.orchestrator.models import Prompt, is_brain_worker, lead_of
from config.payloads import MalformedJson, Unstorable, loads
from sagas import actions, errors
from sagas.access import collaborator_card, visible_collaborators
from sagas.models import AgentRequest, Collaborator, RemoteAgent, RemoteCall, Run


@dataclass
class Call:
    run: Run
    collaborator: Collaborator
    turn: int
    call_id: str

    @property
    def idempotency_key(self) -> str:
        return f"{self.run.pk}:{self.call_id}"


@dataclass
class Outcome:
    result: dict[str, Any] | None  # None: the call waits; its result comes when the run resumes
    finished: bool = False
    rests: bool = False  # the turn ends with this call's result, and the run idles (a teammate's finish)
    extra: dict[str, Any] = field(default_factory=dict)


def tool_error(code: str, message: str) -> Outcome:
    return Outcome({"error": {"code": code, "message": message}})


def get_collaborators(call: Call) -> Outcome:
    return Outcome({"collaborators": [collaborator_card(c) for c in visible_collaborators(call.collaborator)]})


def ask_agent(
    call: Call, to: str, type: str, payload: Any, mode: str = "async", timeout_s: float | None = None
) -> Outcome:
    name = call.collaborator.name
    if is_brain_worker(name) and to == f"agent:{lead_of(name)}" and leads_a_prompt(call.collaborator.saga_id, to):
        raise errors.RecipientUnavailable(
            "The prompt's lead takes no questions: answer with what you have and name what is missing in "
            "next_questions, or ask a person (ask_human)."
        )
    request, _ = actions.ask_agent(
        sender=call.collaborator, to=to, type=type, payload=payload, mode=mode, timeout_s=timeout_s,
        idempotency_key=call.idempotency_key,
    )  # fmt: skip
    if mode != AgentRequest.Mode.WAIT:
        return Outcome({"request_id": request.pk, "status": request.status})
    actions.park_on_request(run=call.run, turn=call.turn, request_id=request.pk, tool_call_id=call.call_id)
    return Outcome(None)


def leads_a_prompt(saga_id: Any, handle: str) -> bool:
    """Whether the agent `handle` leads a prompt: `brain-` in a name alone reserves nothing (an
    agent named after its profile, and its delegates, ask one another as any others do)."""
    return Prompt.objects.filter(saga_id=saga_id, lead__name=handle.removeprefix("agent:")).exists()


def ask_remote_agent(
    call: Call, agent: str, message: Any, mode: str = "wait", timeout_s: float | None = None
) -> Outcome:
    remote, _ = actions.call_remote_agent(
        caller=call.collaborator, agent=agent, message=message, mode=mode, timeout_s=timeout_s,
        idempotency_key=call.idempotency_key,
    )  # fmt: skip
    if mode != RemoteCall.Mode.WAIT:
        return Outcome({"call_id": remote.pk, "status": remote.status})
    actions.park_on_remote(run=call.run, turn=call.turn, call_id=remote.pk, tool_call_id=call.call_id)
    return Outcome(None)


def reply(call: Call, request_id: str, payload: Any = None, error: Any = None) -> Outcome:
    request = actions.reply_to_request(request_id=request_id, by=call.collaborator.user, payload=payload, error=error)
    return Outcome({"request_id": request.pk, "status": request.status})


def cancel_request(call: Call, request_id: str) -> Outcome:
    request = actions.cancel_request(request_id=request_id, by=call.collaborator.user)
    return Outcome({"request_id": request.pk, "status": request.status})


def ask_human(call: Call, title: str, fields: list[Any], to: str | None = None) -> Outcome:
    form, _ = actions.ask_human(
        asker=call.collaborator, title=title, fields=fields, to=to, idempotency_key=call.idempotency_key
    )
    return Outcome({"human_request_id": form.pk, "status": form.status})


def delegate(call: Call, name: str, role: str, task: str, profile: str | None = None) -> Outcome:
    child, _ = actions.add_agent(
        saga=call.collaborator.saga, name=name, role=role, task=task, runtime=Collaborator.Runtime.INTERNAL,
        profile=profile or call.collaborator.profile, parent=call.collaborator.handle, by=call.collaborator.user,
    )  # fmt: skip
    return Outcome(collaborator_card(child))


def finish(call: Call, result: Any = None) -> Outcome:
    if call.run.team_id is not None:  # a teammate stays: it idles until steering wakes it
        return Outcome({"status": "idle", "result": result}, rests=True)
    return Outcome({"status": "completed"}, finished=True, extra={"result": result})


def spawn_teammate(call: Call, name: str, prompt: str, role: str = "", profile: str | None = None) -> Outcome:
    mate, _ = actions.spawn_teammate(
        lead=call.collaborator, name=name, role=role or (profile or "Teammate"), prompt=prompt,
        profile=profile or call.collaborator.profile, by=call.collaborator.user, idempotency_key=call.idempotency_key,
    )  # fmt: skip
    return Outcome(collaborator_card(mate))


def broadcast(call: Call, content: Any) -> Outcome:
    sent, _ = actions.broadcast(
        lead=call.collaborator, content=content, by=call.collaborator.user, idempotency_key=call.idempotency_key
    )
    return Outcome({"broadcast_id": sent.pk, "recipients": sent.recipients})


def shutdown_teammate(call: Call, name: str, reason: str = "") -> Outcome:
    team = actions.team_of(call.collaborator.saga, call.collaborator.handle)
    handle = name if ":" in name else f"agent:{name}"
    run = actions.shutdown_teammate(
        teammate=actions.find_teammate(team, handle), reason=reason or "Shut down by its lead.",
        by=call.collaborator.user,
    )  # fmt: skip
    return Outcome({"id": handle, "status": run.status})


ANY: dict[str, Any] = {}  # any JSON value
STRING = {"type": "string"}
TOOLS: dict[str, tuple[Callable[..., Outcome], str, dict[str, Any], list[str]]] = {
    "get_collaborators": (get_collaborators, "List the people and agents of this saga you can see.", {}, []),
    "ask_agent": (
        ask_agent,
        "Send a request to another agent. mode=async returns a request_id at once and the reply arrives "
        "in a later turn; mode=wait returns the reply as this call's result (or timed_out).",
        {
            "to": {"type": "string", "description": "Collaborator id such as agent:coder-01."},
            "type": {"type": "string", "description": "A short dotted request type such as code.review."},
            "payload": ANY,
            "mode": {"type": "string", "enum": ["async", "wait"]},
            "timeout_s": {"type": "number", "description": "How long a wait may last."},
        },
        ["to", "type", "payload"],
    ),
    "ask_remote_agent": (
        ask_remote_agent,
        "Send a message to a remote A2A agent this saga allows (by its name, or its exact URL). "
        "mode=wait (default) returns its reply as this call's result, or an error (timeout included); "
        "mode=async returns a call_id at once and the outcome arrives in a later turn.",
        {
            "agent": {"type": "string", "description": "The allowed remote agent's name or URL."},
            "message": {"description": "Text, or any JSON value (sent as a data part)."},
            "mode": {"type": "string", "enum": ["wait", "async"]},
            "timeout_s": {"type": "number", "description": "How long the remote agent has to finish."},
        },
        ["agent", "message"],
    ),
    "reply": (
        reply,
        "Answer a request addressed to you, with a payload or an error.",
        {"request_id": STRING, "payload": ANY, "error": ANY},
        ["request_id"],
    ),
    "cancel_request": (cancel_request, "Withdraw a request you sent.", {"request_id": STRING}, ["request_id"]),
    "ask_human": (
        ask_human,
        "Ask a person of the saga to fill in a form; the answer arrives in a later turn.",
        {
            "to": {"type": "string", "description": "human:<name>; the saga's owner when omitted."},
            "title": STRING,
            "fields": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": STRING,
                        "label": STRING,
                        "required": {"type": "boolean"},
                        "type": {
                            "type": "string",
                            "enum": [
                                "text",
                                "textarea",
                                "integer",
                                "number",
                                "boolean",
                                "choice",
                                "multichoice",
                                "date",
                                "email",
                            ],
                        },
                        "choices": {"type": "array", "items": STRING},
                    },
                    "required": ["name", "type"],
                },
            },
        },
        ["title", "fields"],
    ),
    "delegate": (
        delegate,
        "Hand a self-contained sub-task to a new agent under you.",
        {"name": STRING, "role": STRING, "task": STRING, "profile": STRING},
        ["name", "role", "task"],
    ),
    "finish": (finish, "End your work with a result.", {"result": ANY}, []),
    "spawn_teammate": (
        spawn_teammate,
        "Add a persistent teammate under you: it works on the prompt, then idles until you or others "
        "send it more; it stays until you shut it down.",
        {"name": STRING, "role": STRING, "profile": STRING, "prompt": STRING},
        ["name", "prompt"],
    ),
    "broadcast": (broadcast, "Send one message to every teammate of your team at work.", {"content": ANY}, ["content"]),
    "shutdown_teammate": (
        shutdown_teammate,
        "End one of your teammates for good; what it was asked and has not answered fails.",
        {"name": STRING, "reason": STRING},
        ["name"],
    ),
}


def schemas(allowed: list[str], *, saga_id: Any = None) -> list[dict[str, Any]]:
    """JSON-schema function definitions of the allowed tools, for the model; `ask_remote_agent`
    names the remote agents the saga allows at this moment."""
    found: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": properties, "required": required},
            },
        }
        for name, (_, description, properties, required) in TOOLS.items()
        if name in allowed
    ]
    if saga_id is not None and "ask_remote_agent" in allowed:
        remotes = RemoteAgent.objects.filter(saga_id=saga_id).order_by("name").values_list("name", "url")
        names = "; ".join(f"{name} ({url})" for name, url in remotes) or "none yet"
        for schema in found:
            if schema["function"]["name"] == "ask_remote_agent":
                schema["function"]["description"] += f" Allowed remote agents: {names}."
    return found


def execute(call: Call, name: str, arguments: str, allowed: list[str]) -> Outcome:
    """Run one tool call; anything wrong with it becomes an error result for the model, not a crash."""
    if name not in TOOLS or name not in allowed:
        return tool_error("unknown_tool", f"No tool {name!r} is available to you.")
    handler, _, properties, required = TOOLS[name]
    try:
        args = loads(arguments or "{}", where="arguments")
    except MalformedJson as exc:
        return tool_error("invalid_arguments", str(exc))
    except Unstorable as exc:  # too deep, or text no database stores: the model hears why, the run goes on
        return tool_error("invalid_payload", str(exc))
    if not isinstance(args, dict):
        return tool_error("invalid_arguments", "Arguments must be a JSON object.")
    if missing := [k for k in required if k not in args]:
        return tool_error("invalid_arguments", f"Missing: {', '.join(missing)}.")
    if unknown := [k for k in args if k not in properties]:
        return tool_error("invalid_arguments", f"Unknown arguments: {', '.join(unknown)}.")
    if wrong := [f"{k} must be {expected(properties[k])}" for k, v in args.items() if not fits(v, properties[k])]:
        return tool_error("invalid_arguments", f"{'; '.join(wrong)}.")
    try:
        return handler(call, **args)
    except errors.KernelError as exc:
        return tool_error(exc.code, exc.detail)
    except (TypeError, ValueError, OverflowError) as exc:  # a value out of range, e.g. timeout_s=1e308
        return tool_error("invalid_arguments", str(exc))


# The Python values of each JSON-schema type of an argument (a bool is no number).
JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "number": (int, float), "integer": int, "boolean": bool, "array": list, "object": dict,
}  # fmt: skip


def fits(value: Any, schema: dict[str, Any]) -> bool:
    """Whether an argument is of its declared type (and one of its enum), checked before any handler
    reads it: a model's `"to": ["agent:x"]` is its mistake to hear about, not the turn's crash."""
    kind = schema.get("type")
    if kind is None:
        return True
    if isinstance(value, bool) and kind in ("number", "integer"):
        return False
    return isinstance(value, JSON_TYPES[kind]) and value in schema.get("enum", [value])


def expected(schema: dict[str, Any]) -> str:
    return f"one of {schema['enum']}" if "enum" in schema else f"a JSON {schema['type']}"
