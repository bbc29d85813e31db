from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from journal.consumers import JournalConsumer


class NoSuchSaga(AsyncWebsocketConsumer):
    """A socket whose path names no saga's journal: refused as an unknown saga is (4404), where
    the router would raise and drop the handshake with a server error."""

    async def connect(self) -> None:
        await self.close(code=4404)


websocket_urlpatterns = [
    path("ws/sagas/<uuid:saga_id>/journal/", JournalConsumer.as_asgi()),
    re_path(r"", NoSuchSaga.as_asgi()),
]
