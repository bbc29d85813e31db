"""Artifacts: named texts and files of a saga, added by whoever may see it."""

import hashlib
import re

from django.conf import settings
from django.db import IntegrityError, transaction

from accounts.models import User
from journal.actions import record
from sagas import errors
from sagas.access import collaborator_for
from sagas.actions.locking import saga_transaction
from sagas.models import ARTIFACT_NAME, Artifact, Saga

CONTENT_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*")
CONTENT_TYPE_MAX = Artifact._meta.get_field("content_type").max_length or 0


def check_artifact(*, name: str, content: bytes, content_type: str) -> str:
    """Validate an upload; returns its content type, normalized (lower case, no parameters)."""
    if not re.fullmatch(ARTIFACT_NAME, name):
        raise errors.InvalidPayload(
            "An artifact's name is letters, digits, '.', '_' and '-', at most 100, starting and ending with a "
            "letter, digit, '_' or '-'.",
            errors={"name": ["Letters, digits, '.', '_' and '-' (e.g. spec.md)."]},
        )
    limit = settings.AGORA_MAX_ARTIFACT_BYTES
    if len(content) > limit:
        raise errors.PayloadTooLarge(f"An artifact holds at most {limit} bytes; this one has {len(content)}.")
    if not content:
        raise errors.InvalidPayload("An artifact cannot be empty.", errors={"content": ["Empty."]})
    kind = (content_type or "application/octet-stream").split(";", 1)[0].strip().lower()
    if not CONTENT_TYPE.fullmatch(kind):
        raise errors.InvalidPayload(f"Not a content type: {content_type!r}.", errors={"content_type": ["type/subtype"]})
    if len(kind) > CONTENT_TYPE_MAX:
        raise errors.InvalidPayload(
            "The content type is too long.", errors={"content_type": [f"At most {CONTENT_TYPE_MAX} characters."]}
        )
    probe = Artifact(content_type=kind)
    if probe.is_text:
        try:
            content.decode("utf-8")
        except UnicodeDecodeError:
            raise errors.InvalidPayload(
                f"A {kind} artifact is UTF-8 text.", errors={"content": ["Not UTF-8 text."]}
            ) from None
    return kind


def add_artifact(*, saga: Saga, name: str, content: bytes, content_type: str, by: User) -> Artifact:
    """Add an artifact to a saga whose page `by` may see; a name is used once per saga."""
    if not Saga.objects.visible_to(by).filter(pk=saga.pk).exists():
        raise errors.NotFound(f"No saga {saga.pk}.")
    kind = check_artifact(name=name, content=content, content_type=content_type)
    me = collaborator_for(by, saga)
    actor = me.handle if me is not None else f"{by.kind}:{by.username}"
    digest = hashlib.sha256(content).hexdigest()
    with saga_transaction(saga):
        try:
            with transaction.atomic():
                artifact = Artifact.objects.create(
                    saga=saga, name=name, content_type=kind, size=len(content), sha256=digest, content=content,
                    added_by=actor,
                )  # fmt: skip
        except IntegrityError:
            raise errors.NameTaken(f"This saga already has an artifact named {name}.") from None
        record(
            saga_id=saga.pk,
            type="artifact.added",
            actor=actor,
            data={"name": name, "content_type": kind, "size": len(content), "sha256": digest},
        )
    return artifact
