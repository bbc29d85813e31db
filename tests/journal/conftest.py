import pytest

from accounts.models import User
from sagas.actions import create_saga
from sagas.models import Saga


@pytest.fixture
def saga(alice: User) -> Saga:
    """Alice's saga; its journal starts with `saga.created` at seq 1."""
    return create_saga(title="Migrate the API", owner=alice)


@pytest.fixture
def base_seq(saga: Saga) -> int:
    """The last seq the saga's creation recorded; the events a test records come after it."""
    return saga.journal_events.count()
