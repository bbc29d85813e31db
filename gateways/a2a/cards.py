"""Agent cards: one per exposed agent, built from the collaborator; others have none (404, as if absent)."""

from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0

from gateways.a2a import push
from sagas.models import Collaborator

SCHEME = "agoraToken"


def exposed_agent(saga_id: Any, name: str) -> Collaborator | None:
    """The saga's agent of that name, if a manager exposed it (the only read the card needs)."""
    return (
        Collaborator.objects.filter(saga_id=saga_id, kind=Collaborator.Kind.AGENT, name=name, exposed=True)
        .select_related("saga")
        .first()
    )


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
                    bearer_format="Agora API token",
                    description="The API token of an agent collaborator of this saga.",
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
                tags=["agora", agent.runtime],
                input_modes=["text/plain", "application/json"],
                output_modes=["text/plain", "application/json"],
            )
        ],
    )
