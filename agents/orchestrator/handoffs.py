"""What crosses the boundary between the Brain and a worker: the HandoffPacket going out, the
WorkerResult coming back (normalized whatever the worker said), the one formatter that shows
results to the primary and the reviewer, and the review gate.

A failure is a result (`progress.status = failed`, the error in `risks`), never an exception that
loses the other workers' results.
"""

import json
import math
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings

from agents.orchestrator.plans import parse_json_object
from sagas.models import ARTIFACT_NAME

Handoff = dict[str, Any]
WorkerResult = dict[str, Any]
# Names → (a reference per artifact found, by name; the names the saga does not have).
ArtifactResolver = Callable[[list[str]], tuple[dict[str, dict[str, Any]], list[str]]]
ARTIFACT_NAMED = re.compile(rf"(?:@?artifact:)?({ARTIFACT_NAME})")
PROGRESS = ("completed", "failed", "blocked", "partial")
DECISIONS = ("approve", "changes_requested", "blocked")
SEVERITIES = ("critical", "high", "medium", "low", "info")

WORKER_CONSTRAINTS = [
    "Work only from this handoff and the original request; you do not see other workers.",
    "Do not address other agents; your result goes back to the Brain.",
    "Finish with your result as the JSON object described in expected_result.",
]


def handoff(*, prompt_id: str, slot: str, goal: str, original_prompt: str, expected: str) -> Handoff:
    """A self-contained HandoffPacket for one worker (its ids derive from the prompt and the slot)."""
    return {
        "id": f"handoff:{prompt_id}:{slot}",
        "task": {
            "id": f"task:{prompt_id}:{slot}",
            "parent_id": f"prompt:{prompt_id}",
            "goal": goal,
            "original_prompt": original_prompt,
        },
        "constraints": list(WORKER_CONSTRAINTS),
        "expected_result": expected,
    }


def result_shape(packet: Handoff) -> dict[str, Any]:
    return {
        "task_id": packet["task"]["id"],
        "parent_id": packet["task"]["parent_id"],
        "progress": {"status": "completed|failed|blocked|partial"},
        "summary": "string",
        "artifacts": [
            {"kind": "file|thread|summary|artifact|check", "uri": "string (kind artifact: its name)", "label": "string"}
        ],
        "risks": ["string"],
        "next_questions": ["string"],
    }


def support_worker_task(packet: Handoff) -> str:
    """The support worker's whole input: the request, its handoff, and the answer's shape (with the
    ids filled in, so that the worker echoes them)."""

    def build(cut: int | None) -> str:
        sent = clipped_packet(packet, cut)
        return (
            f"Original request:\n{sent['task']['original_prompt']}\n\n"
            f"Your handoff:\n{json.dumps(sent, ensure_ascii=False)}\n\n"
            f"Answer by calling finish with this JSON object as its result:\n{json.dumps(result_shape(packet))}"
        )

    return fitted(build)


def fitted(build: Callable[[int | None], str]) -> str:
    """A delegation's task within the kernel's limit on a task (`AGORA_MAX_GOAL_CHARS`), which a long
    request (its artifacts inlined), a long goal, summary or answer would pass: whole when it fits,
    else with each such part cut (`build(cut)`, clip()) to the longest length that fits."""
    limit = settings.AGORA_MAX_GOAL_CHARS
    task = build(None)
    if len(task) <= limit:
        return task
    low, high = 0, len(task)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if len(build(middle)) <= limit else (low, middle - 1)
    return build(low)  # still too long with every part cut to nothing: the kernel refuses it, the step fails


def clip(text: str, cut: int | None) -> str:
    if cut is None or len(text) <= cut:
        return text
    return f"{text[:cut]} […{len(text) - cut} characters cut]"


def clipped_packet(packet: Handoff, cut: int | None) -> Handoff:
    task = packet["task"]
    return {**packet, "task": {**task, "goal": clip(task["goal"], cut),
                               "original_prompt": clip(task["original_prompt"], cut)}}  # fmt: skip


def _choice(value: Any, allowed: tuple[str, ...]) -> str | None:
    """The allowed value a model meant, whatever its case and surrounding spaces (`" Approve "` is
    `approve`); None when it is none of them."""
    token = value.strip().lower() if isinstance(value, str) else None
    return token if token in allowed else None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, list):
        return [str(v) for v in value if v not in (None, "")]
    return []


def artifact_name(entry: Any) -> str | None:
    """The saga artifact an entry names: a bare name (`spec.md`, `@artifact:spec.md`), or an entry
    of kind `artifact` whose `name` or `uri` is one. None for anything else."""
    if isinstance(entry, dict):
        if _choice(entry.get("kind"), ("artifact",)) is None:
            return None
        entry = entry.get("name") or entry.get("uri")
    named = ARTIFACT_NAMED.fullmatch(entry.strip()) if isinstance(entry, str) else None
    return named.group(1) if named else None


def _artifacts(value: Any, resolve: ArtifactResolver | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The result's context references, and a risk per artifact named that the saga does not have.

    Names become references to the saga's artifacts (`resolve`: kind, uri of its download, label,
    content type, size, digest). An unknown name is kept out of `artifacts`, where it would be a
    link to nothing, and said in `risks`, which the primary and the reviewer read."""
    entries: list[tuple[dict[str, Any] | None, str, str]] = []  # (a kept reference, or a name and its label)
    for entry in value if isinstance(value, list) else []:
        if (name := artifact_name(entry)) is not None:
            label = entry.get("label") if isinstance(entry, dict) else None
            entries.append((None, name, label if isinstance(label, str) else ""))
        elif isinstance(entry, dict) and isinstance(entry.get("uri"), str):
            entries.append(({k: str(entry[k]) for k in ("kind", "uri", "label", "status") if k in entry}, "", ""))
    names = list(dict.fromkeys(name for ref, name, _ in entries if ref is None))
    found, unknown = resolve(names) if names and resolve is not None else ({}, names)
    refs: list[dict[str, Any]] = []
    for ref, name, label in entries:
        if ref is not None:
            refs.append(ref)
        elif name in found and all(r.get("name") != name for r in refs):
            refs.append({**found[name], **({"label": label} if label else {})})
    return refs, [f"Artifact {n} is not in this saga: the result names it, nothing was attached." for n in unknown]


def normalize_worker_result(output: Any, packet: Handoff, *, resolve: ArtifactResolver | None = None) -> WorkerResult:
    """A WorkerResult from whatever the worker finished with: the expected JSON (an object, or text
    holding one), or plain text, which becomes the summary. The ids always come from the handoff;
    artifact names are resolved through `resolve` (without it, none is found)."""
    data = output if isinstance(output, dict) else parse_json_object(output) if isinstance(output, str) else None
    text = output if isinstance(output, str) else "" if output is None else json.dumps(output, ensure_ascii=False)
    known = {"summary", "progress", "risks", "artifacts", "next_questions", "nextQuestions"}
    if data is None or not (known & set(data)):
        data = {"summary": text.strip()}
    progress = data.get("progress")
    status = progress.get("status") if isinstance(progress, dict) else progress
    summary = data.get("summary")
    if not isinstance(summary, str):  # none at all is no summary, not "null"
        summary = "" if summary is None else json.dumps(summary, ensure_ascii=False)
    artifacts, missing = _artifacts(data.get("artifacts"), resolve)
    return {
        "handoff_id": packet["id"],
        "task_id": packet["task"]["id"],
        "parent_id": packet["task"]["parent_id"],
        "progress": {"status": _choice(status, PROGRESS) or "completed"},
        "summary": summary,
        "artifacts": artifacts,
        "risks": _strings(data.get("risks")) + missing,
        "next_questions": _strings(data.get("next_questions", data.get("nextQuestions"))),
    }


def failed_worker_result(packet: Handoff, error: str) -> WorkerResult:
    return {
        "handoff_id": packet["id"],
        "task_id": packet["task"]["id"],
        "parent_id": packet["task"]["parent_id"],
        "progress": {"status": "failed"},
        "summary": "",
        "artifacts": [],
        "risks": [error or "the worker failed"],
        "next_questions": [],
    }


def executed(result: WorkerResult, *, role: str, goal: str, error: str = "") -> dict[str, Any]:
    """The merge side's view of a result (the seed's ExecutedWorkerResult): never shown to a worker
    except through format_worker_results."""
    entry = {**result, "role": role, "goal": goal, "status": result["progress"]["status"]}
    if error:
        entry["error"] = error
    return entry


def format_worker_results(results: list[dict[str, Any]], cut: int | None = None) -> str:
    """The one formatter for worker results in a prompt (primary and review alike); `cut`: see clip()."""
    if not results:
        return "(no support workers ran)"
    blocks = []
    for r in results:
        summary = clip(r["summary"], cut)
        lines = [
            f"### {r['role']} ({r['status']})",
            f"Task: {r['task_id']} -> {r['parent_id']}",
            f"Goal: {clip(r['goal'], cut)}",
            f"Progress: {r['status']}: {summary}",
            f"Summary: {summary}",
            "Risks:",
            *[f"- {clip(risk, cut)}" for risk in r["risks"] or ["none"]],
            "Open questions:",
            *[f"- {clip(q, cut)}" for q in r["next_questions"] or ["none"]],
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def primary_task(original_prompt: str, results: list[dict[str, Any]], role: str) -> str:
    return fitted(
        lambda cut: (
            f"You are the primary ({role}) agent: you write the answer the user sees.\n\n"
            f"Original request:\n{clip(original_prompt, cut)}\n\n"
            f"Worker results:\n{format_worker_results(results, cut)}\n\n"
            "Treat the worker results as advisory context and resolve conflicts between them explicitly. "
            "Finish with your answer, in free text, as the result."
        )
    )


REVIEW_SHAPE = {
    "decision": "approve|changes_requested|blocked",
    "confidence": 0.0,
    "findings": [{"severity": "|".join(SEVERITIES), "title": "string", "detail": "string"}],
    "required_changes": ["string"],
    "blocking_issues": ["string"],
    "residual_risks": ["string"],
}


def review_task(original_prompt: str, answer: str, results: list[dict[str, Any]], packet: Handoff) -> str:
    return fitted(
        lambda cut: (
            "You review the primary agent's answer; you change nothing yourself.\n\n"
            f"Original request:\n{clip(original_prompt, cut)}\n\n"
            f"Primary answer:\n{clip(answer, cut)}\n\n"
            f"Worker results:\n{format_worker_results(results, cut)}\n\n"
            f"Your handoff:\n{json.dumps(clipped_packet(packet, cut), ensure_ascii=False)}\n\n"
            f"Finish with this JSON object as your result:\n{json.dumps(REVIEW_SHAPE)}"
        )
    )


def gate_review(output: Any, results: list[dict[str, Any]], *, policy: str) -> dict[str, Any]:
    """The runtime review gate: the reviewer's decision, demoted from approve when a worker reported
    a failed check or failed itself; a missing or malformed review becomes what the brain's policy
    says (`blocked` or `changes_requested`)."""
    data = output if isinstance(output, dict) else parse_json_object(output) if isinstance(output, str) else None
    if data is None or (decision := _choice(data.get("decision"), DECISIONS)) is None:
        return {
            "decision": policy,
            "confidence": 0.0,
            "findings": [],
            "required_changes": [],
            "blocking_issues": ["The review is missing or malformed."] if policy == "blocked" else [],
            "residual_risks": ["No usable review: the answer was not reviewed."],
            "source": "policy",
        }
    findings = [
        {
            "severity": _choice(f.get("severity"), SEVERITIES) or "info",
            "title": str(f.get("title", "")),
            "detail": str(f.get("detail", "")),
        }
        for f in _list(data.get("findings"))
        if isinstance(f, dict)
    ]
    review: dict[str, Any] = {
        "decision": decision,
        "confidence": _confidence(data.get("confidence")),
        "findings": findings,
        "required_changes": _strings(data.get("required_changes")),
        "blocking_issues": _strings(data.get("blocking_issues")),
        "residual_risks": _strings(data.get("residual_risks")),
        "source": "reviewer",
    }
    failed = [r["role"] for r in results if r["status"] == "failed"]
    failed_checks = [
        a.get("label") or a["uri"]
        for r in results
        for a in r["artifacts"]
        if _choice(a.get("kind"), ("check",)) and _choice(a.get("status"), ("failed",))
    ]
    if review["decision"] == "approve" and (failed or failed_checks):
        review["decision"] = "changes_requested"
        review["demoted_from"] = "approve"
        review["residual_risks"] += [f"worker {role} failed" for role in failed] + [
            f"check failed: {name}" for name in failed_checks
        ]
    return review


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _confidence(value: Any) -> float:
    """Between 0 and 1; anything else a model may write (a string, a huge integer, 1e999) is 0."""
    try:
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
    except OverflowError:
        return 0.0
    return min(max(number, 0.0), 1.0) if math.isfinite(number) else 0.0


def merge_review(answer: str, review: dict[str, Any]) -> str:
    """The final answer: the primary's, then the review's decision and what it asks for."""
    lines = [answer.rstrip(), "", f"Review: {review['decision']}"]
    for finding in review["findings"]:
        lines.append(f"- [{finding['severity']}] {finding['title']}: {finding['detail']}".rstrip(": "))
    lines += [f"- required: {c}" for c in review["required_changes"]]
    lines += [f"- blocking: {c}" for c in review["blocking_issues"]]
    lines += [f"- risk: {c}" for c in review["residual_risks"]]
    return "\n".join(lines).strip()


def team_answer(results: list[dict[str, Any]]) -> str:
    """Forced roles: every answer side by side."""
    return "\n\n".join(
        f"## {r['role']} ({r['status']})\n{r['summary'] or '; '.join(r['risks'])}".rstrip() for r in results
    )
