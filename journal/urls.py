from django.urls import path

from journal.views import JournalExportApi

urlpatterns = [
    path("sagas/<uuid:saga_id>/journal.jsonl", JournalExportApi.as_view(), name="journal-export"),
]
