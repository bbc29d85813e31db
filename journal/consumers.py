from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.actions import token_group
from accounts.authentication import authenticate_key, token_from_scope
from accounts.models import ApiToken
from config.params import InvalidParameter, integer_param
from config.payloads import Unstorable, loads
from journal.access import EventFilter, reader_filter, viewable_saga
from journal.actions import group_name
from journal.models import JournalEvent

REPLAY_BATCH = 500


class JournalConsumer(AsyncJsonWebsocketConsumer):
    """`/ws/sagas/<id>/journal/?after=N`: replays the events after N from the database, then streams.

    The channel layer delivers at most once, so a live event that skips a seq makes the consumer
    read the gap back from the database; the client sees every event it may see once, in order.
    Which events those are is the kernel's rule (`reader_filter`), applied here per batch, so that
    the fan-out of an event to every socket stays the same cheap message for every reader.
    """

    last_seq = 0  # the last seq read, shown to this reader or not
    group = ""
    saga_id: object = None
    lens: EventFilter | None = None
    token_id: int | None = None  # the token the socket authenticated with, if it did with one
    revoked = False

    async def connect(self) -> None:
        saga_id = self.scope["url_route"]["kwargs"]["saga_id"]
        raw = self.scope["query_string"].decode(errors="replace")  # the client's bytes, as Django reads a URL's
        query = {name: values[0] for name, values in parse_qs(raw).items()}
        try:
            self.last_seq = integer_param(query, "after", default=0)
        except InvalidParameter:
            await self.close(code=4400)
            return
        if not await database_sync_to_async(self.may_view)(saga_id):
            await self.close(code=4404)  # before accept: the handshake is refused
            return
        self.group = group_name(saga_id)
        if self.token_id is not None:  # told to close when its token is revoked (accounts.actions)
            await self.channel_layer.group_add(token_group(self.token_id), self.channel_name)
        await self.channel_layer.group_add(self.group, self.channel_name)  # first listen, then replay
        await self.accept()
        await self.catch_up()

    def may_view(self, saga_id: str) -> bool:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            key = token_from_scope(self.scope)
            token = authenticate_key(key) if key else None
            user = token.user if token else None
            self.token_id = token.pk if token else None
        if user is None:
            return False
        saga = viewable_saga(user, saga_id)
        if saga is None:
            return False
        self.saga_id, self.lens = saga.pk, reader_filter(user, saga)
        return True

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.token_id is not None:
            await self.channel_layer.group_discard(token_group(self.token_id), self.channel_name)

    async def token_revoked(self, message: dict[str, Any] | None = None) -> None:
        if not self.revoked:
            self.revoked = True
            await self.close(code=4401)

    def token_holds(self) -> bool:
        return self.token_id is None or ApiToken.objects.filter(pk=self.token_id).exists()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """The journal is read-only and clients only listen; whatever they send is checked as any
        input is (config/payloads.py), answered with an error frame when it is not acceptable, and
        otherwise ignored. Never an exception: that would drop the socket with a server error."""
        if text_data is None:
            await self.send_json({"type": "error", "code": "invalid_payload", "detail": "Send JSON text frames."})
            return
        try:
            loads(text_data, where="message")
        except Unstorable as exc:
            await self.send_json({"type": "error", "code": "invalid_payload", "detail": str(exc)})

    async def journal_events(self, message: dict[str, Any]) -> None:
        """Events of this saga, in seq order (several when they were committed close together).

        A token-authenticated socket checks its token first: a revocation whose announcement was
        lost still closes it at the next event."""
        if self.revoked:
            return
        if self.token_id is not None and not await database_sync_to_async(self.token_holds)():
            await self.token_revoked()
            return
        events = [event for event in message["events"] if event["seq"] > self.last_seq]  # else sent by the replay
        if not events:
            return
        if [e["seq"] for e in events] != list(range(self.last_seq + 1, self.last_seq + 1 + len(events))):
            await self.catch_up()  # a missed publish: read the gap from the database
            return
        await self.send_batch(events[-1]["seq"], await self.visible(events))

    async def catch_up(self) -> None:
        while True:
            last, batch = await database_sync_to_async(self.events_after)(self.last_seq)
            if last is None:
                return
            await self.send_batch(last, batch)

    def events_after(self, after: int) -> tuple[int | None, list[dict[str, Any]]]:
        """(the last seq read, or None at the end; the events of those the reader may see)."""
        assert self.lens is not None
        rows = list(JournalEvent.objects.for_saga(self.saga_id, after=after)[:REPLAY_BATCH])
        return (rows[-1].seq if rows else None), [e.as_dict() for e in self.lens.visible(rows)]

    async def visible(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self.lens is not None
        if self.lens.everything:  # managers: no database read per batch
            return events
        return await database_sync_to_async(self.lens.visible)(events)

    async def send_batch(self, last_seq: int, events: list[dict[str, Any]]) -> None:
        for event in events:
            await self.send_json({"type": "event", "event": event})
        self.last_seq = last_seq
