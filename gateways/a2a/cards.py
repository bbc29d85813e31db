"""Agent cards: one per exposed agent, built from the collaborator; others have none (404, as if absent)."""

import uuid
from typing import Any

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0
from django.conf import settings
from google.protobuf.json_format import MessageToDict

from gateways.a2a import push
from sagas.models import Collaborator

SCHEME = "agoraKey"


def exposed_agent(saga_id: Any, name: str) -> Collaborator | None:
    """The saga's agent of that name, if a manager exposed it (the only read the card needs)."""
    return (
        Collaborator.objects.filter(saga_id=saga_id, kind=Collaborator.Kind.AGENT, name=name, exposed=True)
        .select_related("saga")
        .first()
    )


def host_agent() -> Collaborator | None:
    """The agent whose card the host's own well-known path serves, where clients (and the TCK)
    look first: the one AGORA_A2A_HOST_AGENT names (`<saga id>/<agent name>`, or an agent name
    alone, which one exposed agent of the instance must bear), else the instance's only exposed
    agent, if it has exactly one."""
    exposed = Collaborator.objects.filter(kind=Collaborator.Kind.AGENT, exposed=True).select_related("saga")
    if named := settings.AGORA_A2A_HOST_AGENT:
        saga_id, _, name = named.rpartition("/")
        if not saga_id:
            exposed = exposed.filter(name=name)
        else:
            try:
                return exposed_agent(uuid.UUID(saga_id), name)
            except ValueError:
                return None
    candidates = list(exposed[:2])
    return candidates[0] if len(candidates) == 1 else None


def card_dict(agent: Collaborator, *, base_url: str) -> dict[str, Any]:
    """The card as JSON: A2A 1.0, with the 0.3 fields beside it where 1.0 has no field of that name
    (url, preferredTransport, security…), so that clients of either version read it. Security
    schemes keep their 1.0 shape only: the SDK's merge would mix both shapes in one entry."""
    card = card_of(agent, base_url=base_url)
    body = agent_card_to_dict(card)
    body["securitySchemes"] = MessageToDict(card)["securitySchemes"]
    return body


def agent_path(agent: Collaborator) -> str:
    return f"/a2a/{agent.saga_id}/{agent.name}/"


def card_of(agent: Collaborator, *, base_url: str) -> pb.AgentCard:
    url = base_url.rstrip("/") + agent_path(agent)
    role = agent.role or agent.name
    return pb.AgentCard(
        name=agent.name,
        description=f"{role} in the Agora saga “{agent.saga.title}”. {agent.task}".strip(),
        version="1.0.0",
        supported_interfaces=[
            pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_1_0),
            pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_0_3),
        ],
        provider=pb.AgentProvider(organization="Agora", url=base_url.rstrip("/") + "/"),
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=push.ENABLED),
        security_schemes={
            SCHEME: pb.SecurityScheme(
                http_auth_security_scheme=pb.HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    bearer_format="Agora API key",
                    description="The API key of an agent collaborator of this saga.",
                )
            )
        },
        security_requirements=[pb.SecurityRequirement(schemes={SCHEME: pb.StringList(list=[])})],
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            pb.AgentSkill(
                id=agent.name,
                name=role,
                description=agent.task or role,
                tags=["agora", role],
                input_modes=["text/plain", "application/json"],
                output_modes=["text/plain", "application/json"],
            )
        ],
    )
