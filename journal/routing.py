from django.urls import path

from journal.consumers import JournalConsumer

websocket_urlpatterns = [
    path("ws/sagas/<uuid:saga_id>/journal/", JournalConsumer.as_asgi()),
]
