"""Reference expansion for prompts (DESIGN.md §7): `@artifact:<name>` appends the artifact of the
prompt's saga; `@@<saga-id>` appends a summary of a prior saga the prompting person may see.

A saga they may not see is refused with `not_found`, worded exactly as for a saga that does not
exist, before anything of it is read; unknown artifact names are one `invalid_payload` naming
them all. Image artifacts go to the models as images (agents.images): only to those that can see them.
"""

import json
import re
import uuid
from typing import Any, NamedTuple

from django.urls import reverse

from config.payloads import storable_text
from journal.models import JournalEvent
from sagas import errors
from sagas.access import JournalLens
from sagas.models import ARTIFACT_NAME, Artifact, Run, Saga

ARTIFACT_REF = re.compile(rf"(?<![\w@])@artifact:({ARTIFACT_NAME})")
SAGA_REF = re.compile(r"(?<![\w@])@@([0-9A-Za-z-]+)")
MAX_ARTIFACT_CHARS = 20_000  # of one text artifact; the rest is cut with a note
MAX_ITEM_CHARS = 1_000  # of one answer or result in a saga summary
LAST_EVENTS = 10
LAST_ANSWERS = 3


class Expansion(NamedTuple):
    text: str
    images: list[str]  # the image artifacts it references, by name, in order: they go to the models as images


def expand_references(*, text: str, saga: Saga, user: Any) -> Expansion:
    """The prompt with a section appended per distinct reference, in order of first appearance."""
    saga_ids = unique(SAGA_REF.findall(text))
    names = unique(ARTIFACT_REF.findall(text))
    prior = [visible_saga(raw, user) for raw in saga_ids]
    artifacts = referenced(saga, names)
    sections = [artifact_section(artifacts[n]) for n in names] + [saga_section(s, user) for s in prior]
    expanded = "\n\n".join([text, *sections]) if sections else text
    return Expansion(text=expanded, images=[n for n in names if artifacts[n].is_image])


def check_references(*, text: str, saga: Saga, user: Any) -> list[str]:
    """What `expand_references` refuses, checked without reading anything of the referenced sagas
    or artifacts: for the web process, that refuses a bad prompt before it is created. Returns the
    image artifacts referenced, by name, as `expand_references` will."""
    for raw in unique(SAGA_REF.findall(text)):
        visible_saga(raw, user)
    names = unique(ARTIFACT_REF.findall(text))
    artifacts = referenced(saga, names, only=("name", "content_type"))
    return [n for n in names if artifacts[n].is_image]


def referenced(saga: Saga, names: list[str], *, only: tuple[str, ...] = ()) -> dict[str, Artifact]:
    """The saga's artifacts a prompt references, by name (`only` those fields); `invalid_payload`
    naming every one the saga does not have."""
    found = Artifact.objects.filter(saga=saga, name__in=names)
    artifacts = {a.name: a for a in (found.only(*only) if only else found)}
    if unknown := [n for n in names if n not in artifacts]:
        raise errors.InvalidPayload(
            f"Unknown artifacts in this saga: {', '.join(unknown)}.",
            errors={"artifacts": [f"No artifact {n} in this saga." for n in unknown]},
        )
    return artifacts


def artifact_refs(*, saga: Saga, names: list[str]) -> list[dict[str, Any]]:
    """References to the artifacts named (see `resolve_artifacts`), or one `invalid_payload` naming
    those the saga does not have."""
    found, unknown = resolve_artifacts(saga=saga, names=names)
    if unknown:
        raise errors.InvalidPayload(
            f"Unknown artifacts in this saga: {', '.join(unknown)}.",
            errors={"artifacts": [f"No artifact {n} in this saga." for n in unknown]},
        )
    return list(found.values())


def resolve_artifacts(*, saga: Saga, names: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """What a WorkerResult's `artifacts` holds for the artifacts a worker names: a context reference
    to each (`{kind, uri, label}`, the uri its REST download, never its content), by name, and the
    names the saga does not have. One query."""
    wanted = unique([n for n in names if isinstance(n, str)])
    found = {a.name: a for a in Artifact.objects.listing(saga).filter(name__in=wanted)}
    refs = {
        n: {
            "kind": "artifact",
            "uri": reverse("api-artifact", args=[saga.pk, n]),
            "label": n,
            "name": n,
            "content_type": found[n].content_type,
            "size": found[n].size,
            "sha256": found[n].sha256,
        }
        for n in wanted
        if n in found
    }
    return refs, [n for n in wanted if n not in found]


def unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def visible_saga(raw: str, user: Any) -> Saga:
    """The saga if `user` may see it; otherwise the same `not_found` as for an id that names nothing."""
    try:
        saga_id = uuid.UUID(raw)
    except ValueError:
        saga_id = None
    saga = None if saga_id is None else Saga.objects.visible_to(user).filter(pk=saga_id).first()
    if saga is None:
        raise errors.NotFound(f"No saga {raw}.")
    return saga


def artifact_section(artifact: Artifact) -> str:
    head = f"--- @artifact:{artifact.name} ({artifact.content_type}, {artifact.size} bytes) ---"
    if artifact.is_image:
        return f"{head}\n[An image, given to the roles that can see images.]"
    if not artifact.is_text:
        return f"{head}\n[A file; download it from the saga's artifacts.]"
    return f"{head}\n{storable_text(cut(artifact.text, MAX_ARTIFACT_CHARS))}"  # a text file may hold a NUL


def saga_section(prior: Saga, user: Any) -> str:
    """A prior saga in a few lines: its goal, its final answers and results, its last events, as
    much of them as `user` may see (DESIGN.md §4, the journal's one visibility rule)."""
    lens = JournalLens(user, prior)
    lines = [f"--- @@{prior.pk}: {prior.title} ({prior.status}) ---", f"Goal: {prior.goal or '(none)'}"]
    events = JournalEvent.objects.filter(saga=prior)
    # Read a few times more than shown: some of the latest may be hidden from this reader.
    answers = lens.visible(list(events.filter(type="prompt.completed").order_by("-seq")[: LAST_ANSWERS * 4]))
    if answers:
        lines.append("Final answers:")
        lines += [f"- {cut(str(e.data.get('answer', '')), MAX_ITEM_CHARS)}" for e in reversed(answers[:LAST_ANSWERS])]
    runs = [
        run
        for run in Run.objects.filter(collaborator__saga=prior, status__in=Run.FINISHED)
        .exclude(result=None)
        .select_related("collaborator")
        .order_by("updated_at")
        if lens.everything or run.collaborator.handle in lens.seen
    ]
    if runs:
        lines.append("Results:")
        lines += [f"- {r.collaborator.handle} ({r.status}): {cut(as_text(r.result), MAX_ITEM_CHARS)}" for r in runs]
    last = lens.visible(list(events.order_by("-seq")[: LAST_EVENTS * 4]))[:LAST_EVENTS]
    if last:
        lines.append("Last events:")
        lines += [f"- #{e.seq} {e.type} {e.actor} {cut(as_text(e.data), 200)}" for e in reversed(last)]
    return "\n".join(lines)


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more characters]"
