"""A tool call's id is its idempotency key within the run: a provider that reuses ids across turns
(`call_0` each time), repeats one in a message or sends none still gets each call made once, and
its result under the id the transcript keeps."""

import pytest

from accounts.models import User
from agents.executor import run_turn
from agents.models import AgentProfile
from agents.transcripts import Transcript
from sagas import actions
from sagas.models import AgentRequest, Run, Saga
from tests.agents.fake_llm import FakeLLM, say, tool_call

pytestmark = pytest.mark.django_db(transaction=True)


def ask(n: int, call_id: str) -> dict[str, object]:
    return tool_call("ask_agent", {"to": "agent:peer", "type": "ping", "payload": {"n": n}, "mode": "async"}, call_id)


def test_reused_repeated_and_missing_call_ids_each_make_their_call(
    saga: Saga, alice: User, model_here: FakeLLM
) -> None:
    model_here.script(
        "asker-m",
        say("", ask(1, "call_0")),
        say("", ask(2, "call_0")),  # the same id in a later turn
        say("", ask(3, "call_1"), ask(4, "call_1")),  # one id twice in a message
        say("", {**ask(5, "x"), "id": ""}),  # no id at all
        say("", tool_call("finish", {"result": "asked"}, "call_0")),
    )
    AgentProfile.objects.create(name="asker", role="Asker", model="asker-m", tools=["ask_agent", "finish"])
    actions.add_agent(saga=saga, name="peer", role="Peer", task="Answer", runtime="external", by=alice)
    asker, _ = actions.add_agent(saga=saga, name="asker", role="Asker", task="Ask", runtime="internal",
                                 profile="asker", by=alice)  # fmt: skip

    for _ in range(5):  # a task's time slice may end before its five turns do: the run queues again
        run_turn(asker.run.pk)

    assert sorted(r.payload["n"] for r in AgentRequest.objects.filter(sender=asker)) == [1, 2, 3, 4, 5]
    run = Run.objects.get(pk=asker.run.pk)
    assert (run.status, run.result) == (Run.Status.COMPLETED, "asked")
    transcript = Transcript(run.pk)
    transcript.read_new()
    called = [c["id"] for m in transcript.messages for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in transcript.messages if m["role"] == "tool"]
    assert (
        len(set(called)) == len(called) == 6 and answered == called[:-1]
    )  # each result under its call's id (finish has none)


@pytest.mark.parametrize(
    ("mode", "call_id"),
    [
        ("async", "call_" + "x" * 185),  # `<run id>:<call id>` past the idempotency key's 200 characters
        ("wait", "call_" + "x" * 125),  # past a parked wait's `wait_tool_call_id` (120)
        ("async", "call\x00one"),  # a NUL: PostgreSQL refuses it in any text column
    ],
)
def test_a_call_id_the_keys_cannot_hold_is_replaced_by_its_digest(
    saga: Saga, alice: User, model_here: FakeLLM, mode: str, call_id: str
) -> None:
    """The provider's id becomes part of the kernel's keys: one they cannot hold failed the turn
    with a database error on PostgreSQL (the run reclaimed, the model asked again, for ever)."""
    asking = tool_call("ask_agent", {"to": "agent:peer", "type": "ping", "payload": {}, "mode": mode}, call_id)
    model_here.script("asker-m", say("", asking), say("", tool_call("finish", {"result": "asked"}, "call_fin")))
    AgentProfile.objects.create(name="asker", role="Asker", model="asker-m", tools=["ask_agent", "finish"])
    actions.add_agent(saga=saga, name="peer", role="Peer", task="Answer", runtime="external", by=alice)
    asker, _ = actions.add_agent(saga=saga, name="asker", role="Asker", task="Ask", runtime="internal",
                                 profile="asker", by=alice)  # fmt: skip

    run_turn(asker.run.pk)

    (request,) = AgentRequest.objects.filter(sender=asker)
    transcript = Transcript(asker.run.pk)
    transcript.read_new()
    called = next(c["id"] for m in transcript.messages for c in m.get("tool_calls") or [])
    assert called.startswith("call_") and len(called) == 37 and called != call_id
    assert request.idempotency_key == f"{asker.run.pk}:{called}"
    run = Run.objects.get(pk=asker.run.pk)
    if mode == "wait":
        assert (run.status, run.wait_tool_call_id) == (Run.Status.WAITING, called)
    else:
        assert [m["tool_call_id"] for m in transcript.messages if m["role"] == "tool"] == [called]
        assert (run.status, run.result) == (Run.Status.COMPLETED, "asked")
