import logging
from collections.abc import Sequence
from functools import partial

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from redis.exceptions import RedisError

from accounts.models import ApiToken, User, hash_token
from config.sql import insert_all

logger = logging.getLogger(__name__)


@transaction.atomic
def issue_token(*, user: User) -> str:
    """Issue a new API token for user and return its key; only its hash is kept."""
    key = ApiToken.new_key("agt_" if user.is_agent else "usr_")
    ApiToken.objects.create(user=user, key_hash=hash_token(key), prefix=key[:12])
    return key


@transaction.atomic
def revoke_tokens(*, user: User) -> int:
    """Delete every token of user: the next call with one fails authentication. After commit, open
    WebSockets authenticated with one are told to close (journal/consumers.py); long-polls re-check
    their token while they wait (sagas/api/waiting.py)."""
    ids = list(ApiToken.objects.filter(user=user).values_list("pk", flat=True))
    ApiToken.objects.filter(pk__in=ids).delete()
    if ids:
        transaction.on_commit(partial(announce_revocation, ids))
    return len(ids)


@transaction.atomic
def rotate_token(*, user: User) -> str:
    """Revoke user's tokens and issue a new one, in one transaction; returns the new key."""
    revoke_tokens(user=user)
    return issue_token(user=user)


def token_group(token_id: int) -> str:
    """The channel-layer group of the sockets authenticated with one token."""
    return f"token.{token_id}"


def announce_revocation(token_ids: list[int]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for token_id in token_ids:
        try:
            async_to_sync(layer.group_send)(token_group(token_id), {"type": "token.revoked"})
        except (RedisError, OSError) as exc:  # a socket that misses this still re-checks its token
            logger.warning("could not announce the revocation of token %s: %s", token_id, exc)


def create_agent_user(*, username: str) -> User:
    """A service user for an agent collaborator: it can hold permissions and tokens, never sign in."""
    (user,) = create_agent_users(usernames=[username])
    return user


def create_agent_users(*, usernames: list[str], keys: Sequence[int] | None = None) -> list[User]:
    """Service users for agent collaborators, with one statement; given their `keys`
    (config.sql.keys_later), deferred."""
    given = keys if keys is not None else [None] * len(usernames)
    users = [User(pk=key, username=name, kind=User.Kind.AGENT) for name, key in zip(usernames, given, strict=True)]
    for user in users:
        user.set_unusable_password()
    return insert_all(users, later=keys is not None)
