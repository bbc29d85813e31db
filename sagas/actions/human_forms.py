"""ask_human: forms to the people of a saga, and their answers."""

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from accounts.models import User
from journal.actions import record
from sagas import errors, forms
from sagas.access import may_manage
from sagas.actions.caps import check_form_caps
from sagas.actions.collaborators import find_collaborator
from sagas.actions.locking import lock_open_saga, lock_saga
from sagas.actions.payloads import payload_size
from sagas.actions.requests import sender_run_id
from sagas.actions.steering import push_steering
from sagas.models import Collaborator, HumanRequest, SteeringItem


@transaction.atomic
def ask_human(
    *, asker: Collaborator, title: str, fields: Any, to: str | None = None, idempotency_key: str = ""
) -> tuple[HumanRequest, bool]:
    """Ask a person of the saga to fill in a form; the answer reaches the asker's steering. The same
    idempotency key with the same form returns the first one; with another, `idempotency_conflict`."""
    if not asker.is_agent:
        raise errors.Forbidden("Only agents ask people through forms.")
    limit = settings.AGORA_MAX_PAYLOAD_BYTES  # a form is a payload too: its labels and choices are stored and shown
    if payload_size([title, fields]) > limit:
        raise errors.InvalidPayload("The form is too large.", errors={"fields": [f"At most {limit} bytes of JSON."]})
    schema = forms.check_schema(fields)
    if not isinstance(title, str) or not title.strip() or len(title) > 200:
        raise errors.InvalidPayload("Bad title.", errors={"title": ["1 to 200 characters."]})
    saga = lock_open_saga(asker.saga_id)
    addressee = find_collaborator(saga, to) if to else Collaborator.objects.get(saga=saga, user=saga.owner)
    if addressee is None or addressee.is_agent:
        raise errors.NotFound(f"No person {to} in this saga.")
    if idempotency_key and (first := HumanRequest.objects.filter(asker=asker, idempotency_key=idempotency_key).first()):
        if (first.addressee_id, first.title, first.fields) != (addressee.pk, title, schema):
            raise errors.IdempotencyConflict("This Idempotency-Key was already used for a different form.")
        return first, False
    if asker.run.is_finished:  # no answer would reach it (finish_run() withdraws the forms it asked)
        raise errors.InvalidState(f"{asker.handle} has ended: no answer would reach it.")
    check_form_caps(saga, asker)
    human_request = HumanRequest.objects.create(
        saga=saga, asker=asker, addressee=addressee, title=title, fields=schema, idempotency_key=idempotency_key
    )
    record(
        saga_id=saga.pk,
        type="human_request.created",
        actor=asker.handle,
        run_id=sender_run_id(asker),
        data={"human_request_id": human_request.pk, "to": addressee.handle, "title": title, "fields": schema},
    )
    return human_request, True


@transaction.atomic
def answer_human_request(*, human_request_id: str, answer: Any, by: User) -> HumanRequest:
    """The addressed person's answer, validated against the form; the first valid answer closes it."""
    human_request = (
        HumanRequest.objects.select_related("saga", "asker", "addressee").filter(pk=human_request_id).first()
    )
    if human_request is None or not visible_human_request(human_request, by):
        raise errors.NotFound(f"No form {human_request_id}.")
    lock_saga(human_request.saga_id)
    if human_request.addressee.user_id != by.pk:
        raise errors.Forbidden("Only the person it is addressed to answers a form.")
    # Its status read again under the lock: a form closed meanwhile says so, whatever the answer.
    human_request.status = HumanRequest.objects.values_list("status", flat=True).get(pk=human_request.pk)
    if human_request.status == HumanRequest.Status.CANCELLED:
        raise errors.RequestClosed(f"{human_request_id} was withdrawn: its asker or its saga has ended.")
    if human_request.status != HumanRequest.Status.PENDING:
        raise errors.AlreadyAnswered(f"{human_request_id} was already answered.")
    clean = forms.check_answer(human_request.fields, answer)
    answered = {
        "status": HumanRequest.Status.ANSWERED,
        "answer": clean,
        "answered_by": by,
        "answered_at": timezone.now(),
    }
    HumanRequest.objects.filter(pk=human_request.pk, status=HumanRequest.Status.PENDING).update(**answered)
    for name, value in answered.items():
        setattr(human_request, name, value)
    push_steering(
        recipient=human_request.asker, kind=SteeringItem.Kind.HUMAN_RESPONSE, sender=human_request.addressee.handle,
        human_request=human_request, payload=clean,
    )  # fmt: skip
    record(
        saga_id=human_request.saga_id,
        type="human_request.answered",
        actor=human_request.addressee.handle,
        data={"human_request_id": human_request.pk, "answer": clean},
    )
    return human_request


def visible_human_request(human_request: HumanRequest, user: User) -> bool:
    return user.pk in (human_request.addressee.user_id, human_request.asker.user_id) or may_manage(
        user, human_request.saga
    )


def cancel_forms(forms: QuerySet[HumanRequest], *, actor: str) -> int:
    """Withdraw the pending forms among `forms` (their asker or their saga has ended), each
    journaled so that the addressees' inboxes drop them; returns how many. Under the saga lock."""
    pending = forms.filter(status=HumanRequest.Status.PENDING)
    withdrawn = 0
    for form_id, saga_id in pending.values_list("pk", "saga_id"):
        if HumanRequest.objects.filter(pk=form_id, status=HumanRequest.Status.PENDING).update(
            status=HumanRequest.Status.CANCELLED
        ):
            record(saga_id=saga_id, type="human_request.cancelled", actor=actor, data={"human_request_id": form_id})
            withdrawn += 1
    return withdrawn
