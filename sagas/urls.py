"""The dashboard's HTML pages. The REST API lives under /api/v1/ in its own module."""

from django.urls import path

from sagas import artifacts, remote_agents, views

app_name = "sagas"

urlpatterns = [
    path("", views.saga_list, name="list"),
    path("sagas/new/", views.saga_create, name="create"),
    path("sagas/<uuid:saga_id>/", views.saga_detail, name="detail"),
    path("sagas/<uuid:saga_id>/journal/", views.journal_rows, name="journal"),
    path("sagas/<uuid:saga_id>/live/<slug:part>/", views.saga_part, name="part"),
    path("sagas/<uuid:saga_id>/forms/<str:human_request_id>/answer/", views.answer_form, name="answer"),
    path("sagas/<uuid:saga_id>/steer/", views.steer_agent, name="steer"),
    path("sagas/<uuid:saga_id>/finish/", views.finish_saga, name="finish"),
    path("sagas/<uuid:saga_id>/agents/", views.add_agent, name="add-agent"),
    path("sagas/<uuid:saga_id>/people/", views.add_person, name="add-person"),
    path("sagas/<uuid:saga_id>/agent-token/", views.agent_token, name="agent-token"),
    path("sagas/<uuid:saga_id>/exposure/", views.agent_exposure, name="exposure"),
    path("sagas/<uuid:saga_id>/artifacts/", artifacts.upload_artifact, name="artifact-upload"),
    path("sagas/<uuid:saga_id>/artifacts/<str:name>", artifacts.download_artifact, name="artifact"),
    path("sagas/<uuid:saga_id>/remote-agents/", remote_agents.allow_remote_agent, name="remote-agent-allow"),
    path("sagas/<uuid:saga_id>/remote-agents/remove/", remote_agents.remove_remote_agent, name="remote-agent-remove"),
]
