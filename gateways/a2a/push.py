"""Push notification configs of A2A tasks (not offered yet: the card says so)."""

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import PushNotificationNotSupportedError

from sagas.models import AgentRequest

ENABLED = False


def register(
    caller: object, request: AgentRequest, config: pb.TaskPushNotificationConfig
) -> pb.TaskPushNotificationConfig:
    raise PushNotificationNotSupportedError


def get(request: AgentRequest, config_id: str) -> pb.TaskPushNotificationConfig:
    raise PushNotificationNotSupportedError


def list_for(request: AgentRequest) -> pb.ListTaskPushNotificationConfigsResponse:
    raise PushNotificationNotSupportedError


def delete(caller: object, request: AgentRequest, config_id: str) -> None:
    raise PushNotificationNotSupportedError
