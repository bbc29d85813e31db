from django.urls import path, re_path

from sagas.api import artifacts, human_requests, remote_agents, requests, schema, teams, tokens, views  # noqa: F401  (schema: its OpenAPI extensions register themselves)
from sagas.api.waiting import waiting_view

urlpatterns = [
    path("sagas/", views.SagaCollectionApi.as_view(), name="api-sagas"),
    path("sagas/<uuid:saga_id>/", views.SagaDetailApi.as_view(), name="api-saga"),
    path("sagas/<uuid:saga_id>/finish/", views.SagaFinishApi.as_view(), name="api-saga-finish"),
    path("sagas/<uuid:saga_id>/collaborators/", views.CollaboratorCollectionApi.as_view(), name="api-collaborators"),
    path(
        "sagas/<uuid:saga_id>/collaborators/<str:cid>/steer/",
        views.CollaboratorSteerApi.as_view(),
        name="api-collaborator-steer",
    ),
    path(
        "sagas/<uuid:saga_id>/collaborators/<str:cid>/token/",
        tokens.CollaboratorTokenApi.as_view(),
        name="api-collaborator-token",
    ),
    path(
        "sagas/<uuid:saga_id>/collaborators/<str:cid>/exposure/",
        views.CollaboratorExposureApi.as_view(),
        name="api-collaborator-exposure",
    ),
    path(
        "sagas/<uuid:saga_id>/remote-agents/",
        remote_agents.RemoteAgentCollectionApi.as_view(),
        name="api-remote-agents",
    ),
    path(
        "sagas/<uuid:saga_id>/remote-agents/<str:name>/",
        remote_agents.RemoteAgentRemoveApi.as_view(),
        name="api-remote-agent",
    ),
    path("sagas/<uuid:saga_id>/requests/", waiting_view(requests.AgentRequestCreateApi), name="api-requests"),
    path(
        "sagas/<uuid:saga_id>/human-requests/",
        human_requests.HumanRequestCreateApi.as_view(),
        name="api-human-requests",
    ),
    path("sagas/<uuid:saga_id>/teams/<str:lead>/", teams.TeamDetailApi.as_view(), name="api-team"),
    path("sagas/<uuid:saga_id>/teams/<str:lead>/teammates/", teams.TeammateSpawnApi.as_view(), name="api-team-spawn"),
    path(
        "sagas/<uuid:saga_id>/teams/<str:lead>/teammates/<str:cid>/shutdown/",
        teams.TeammateShutdownApi.as_view(),
        name="api-team-shutdown",
    ),
    path(
        "sagas/<uuid:saga_id>/teams/<str:lead>/broadcasts/",
        teams.BroadcastCreateApi.as_view(),
        name="api-team-broadcast",
    ),
    path("sagas/<uuid:saga_id>/teams/<str:lead>/inbox/", teams.InboxApi.as_view(), name="api-team-inbox"),
    path("sagas/<uuid:saga_id>/journal/", views.JournalEventListApi.as_view(), name="api-journal"),
    path("sagas/<uuid:saga_id>/artifacts/", artifacts.ArtifactCollectionApi.as_view(), name="api-artifacts"),
    path("sagas/<uuid:saga_id>/artifacts/<str:name>", artifacts.ArtifactDownloadApi.as_view(), name="api-artifact"),
    path("requests/<str:request_id>/", requests.AgentRequestDetailApi.as_view(), name="api-request"),
    path("requests/<str:request_id>/reply/", requests.AgentRequestReplyApi.as_view(), name="api-request-reply"),
    path("requests/<str:request_id>/cancel/", requests.AgentRequestCancelApi.as_view(), name="api-request-cancel"),
    path("steering/", waiting_view(requests.SteeringFeedApi), name="api-steering"),
    path("runs/<str:run_id>/status/", views.RunStatusApi.as_view(), name="api-run-status"),
    path("human-requests/", human_requests.HumanRequestListApi.as_view(), name="api-human-request-list"),
    path(
        "human-requests/<str:human_request_id>/",
        human_requests.HumanRequestDetailApi.as_view(),
        name="api-human-request",
    ),
    path(
        "human-requests/<str:human_request_id>/answer/",
        human_requests.HumanRequestAnswerApi.as_view(),
        name="api-human-request-answer",
    ),
]

# Last, after every other /api/v1/ route (config/urls.py includes this module last).
fallback = [re_path(r"^.*$", views.ApiNotFound.as_view(), name="api-not-found")]
