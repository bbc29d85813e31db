from django.db import transaction

from accounts.models import ApiToken, User, hash_token


@transaction.atomic
def issue_token(*, user: User) -> str:
    """Issue a new API token for user and return its key; only its hash is kept."""
    key = ApiToken.new_key("agt_" if user.is_agent else "usr_")
    ApiToken.objects.create(user=user, key_hash=hash_token(key), prefix=key[:12])
    return key


def create_agent_user(*, username: str) -> User:
    """A service user for an agent collaborator: it can hold permissions and tokens, never sign in."""
    user = User(username=username, kind=User.Kind.AGENT)
    user.set_unusable_password()
    user.save()
    return user
