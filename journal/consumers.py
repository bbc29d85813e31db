from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.authentication import authenticate_key, token_from_scope
from journal.access import viewable_saga
from journal.actions import group_name
from journal.models import JournalEvent

REPLAY_BATCH = 500


class JournalConsumer(AsyncJsonWebsocketConsumer):
    """`/ws/sagas/<id>/journal/?after=N`: replays the events after N from the database, then streams.

    The channel layer delivers at most once, so a live event that skips a seq makes the consumer
    read the gap back from the database; the client sees every event once, in order.
    """

    last_seq = 0
    group = ""
    saga_id: object = None

    async def connect(self) -> None:
        saga_id = self.scope["url_route"]["kwargs"]["saga_id"]
        try:
            self.last_seq = int(parse_qs(self.scope["query_string"].decode()).get("after", ["0"])[0])
        except ValueError:
            await self.close(code=4400)
            return
        if not await database_sync_to_async(self.may_view)(saga_id):
            await self.close(code=4404)  # before accept: the handshake is refused
            return
        self.group = group_name(saga_id)
        await self.channel_layer.group_add(self.group, self.channel_name)  # first listen, then replay
        await self.accept()
        await self.catch_up()

    def may_view(self, saga_id: str) -> bool:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            key = token_from_scope(self.scope)
            token = authenticate_key(key) if key else None
            user = token.user if token else None
        if user is None:
            return False
        saga = viewable_saga(user, saga_id)
        self.saga_id = saga.pk if saga else None
        return saga is not None

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the journal is read-only; clients only listen

    async def journal_events(self, message: dict[str, Any]) -> None:
        """Events of this saga, in seq order (several when they were committed close together)."""
        for event in message["events"]:
            if event["seq"] <= self.last_seq:
                continue  # already sent by the replay
            if event["seq"] > self.last_seq + 1:
                await self.catch_up()  # a missed publish: read the gap from the database
                continue
            await self.send_event(event)

    async def catch_up(self) -> None:
        while batch := await database_sync_to_async(self.events_after)(self.last_seq):
            for event in batch:
                await self.send_event(event)

    def events_after(self, after: int) -> list[dict[str, Any]]:
        return [e.as_dict() for e in JournalEvent.objects.for_saga(self.saga_id, after=after)[:REPLAY_BATCH]]

    async def send_event(self, event: dict[str, Any]) -> None:
        self.last_seq = event["seq"]
        await self.send_json({"type": "event", "event": event})
