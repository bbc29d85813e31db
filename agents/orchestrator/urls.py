"""The orchestrator's routes: REST under /api/v1/ (`api`) and the saga page's prompt box (`pages`)."""

from django.urls import path

from agents.orchestrator import api, views

api_urls = [
    path("sagas/<uuid:saga_id>/prompts/", api.PromptCollectionApi.as_view(), name="api-prompts"),
    path("prompts/<uuid:prompt_id>/", api.PromptDetailApi.as_view(), name="api-prompt"),
    path("prompts/<uuid:prompt_id>/cancel/", api.PromptCancelApi.as_view(), name="api-prompt-cancel"),
]

page_urls = [
    path("sagas/<uuid:saga_id>/prompts/", views.submit_prompt, name="prompt-submit"),
    path("sagas/<uuid:saga_id>/prompts/<uuid:prompt_id>/", views.prompt_page, name="prompt-page"),
    path("sagas/<uuid:saga_id>/prompts/<uuid:prompt_id>/cancel/", views.cancel_prompt, name="prompt-cancel"),
]
