"""The turn executor: a task claims a run's turns and runs them (agents.turns), then, within its time
slice, the runs they rang; for a prompt's worker, the orchestration's next step, and the run that
step handed to this task.
"""

import logging
import time
from functools import partial

from django.conf import settings
from django.db import DatabaseError, connection

from agents import transcripts
from agents.heartbeat import heartbeat
from agents.models import AgentProfile
from agents.orchestrator import starts
from agents.orchestrator.models import is_brain_worker
from agents.orchestrator.tasks import advance_after
from agents.transcripts import keep_transcript
from agents.turns import LostTurn, Turns
from config.sql import await_commit, columns, commit_unawaited
from sagas import actions
from sagas.models import Collaborator, Delegation
from sagas.wakeups import rung_here

logger = logging.getLogger(__name__)


def run_turn(run_id: str, *, worker: str = "") -> None:
    """The turns of one run; `worker` is this worker's node name, recorded on the run and in the
    journal so that operators can tell which host ran what. Then, within the task's time slice
    (`AGORA_TURN_SLICE_S`), the runs those turns rang, in order (rung_here()): an agent asked, the
    asker its reply woke. The process is free now, and its claim comes sooner than the doorbell's
    trip back through the broker; where another process was free first, it has the run already
    and this claim finds it taken. A doorbell that comes after finds the same."""
    ends = time.monotonic() + settings.AGORA_TURN_SLICE_S
    with rung_here() as rung:
        run_one(run_id, worker=worker)
        while rung and time.monotonic() < ends:
            run_one(rung.pop(0), worker=worker, look_first=True)  # a free worker may have it already


def run_one(run_id: str, *, worker: str = "", look_first: bool = False) -> None:
    """Claim the run's turns and run them; nothing when another task holds them or they are done."""
    try:
        turns = claim_turns(run_id, worker=worker, look_first=look_first)
    finally:
        if connection.errors_occurred:  # the next task starts on a fresh connection
            connection.close()
    if turns is not None:
        run_claimed(turns)


def claim_turns(run_id: str, *, worker: str = "", look_first: bool = False) -> "Turns | None":
    """Claim the run's next turn and start it (start()), in a transaction of its own; or, called
    inside one (an orchestration step's, which has just created the run for this task), in that
    one: one commit for both. When the model call comes next (Turns.execute), that COMMIT goes
    without waiting for its answer, which the call reads once its request is out; the step's
    doorbells (its other workers) ring then. None: a redelivered doorbell, or another worker holds
    the run. `look_first`: see actions.claimed_run()."""
    ahead = partial(transcripts.read_ahead, run_id)
    with actions.claimed_run(
        _CLAIMED_RUN_SQL, run_id, AgentProfile, worker=worker, ahead=ahead, look_first=look_first
    ) as claimed:
        if claimed is None:
            return None
        turns = Turns(claimed, worker=worker)
        turns.go_on = turns.start()
        if turns.go_on and turns.pending is None:
            commit_unawaited()
    return turns


def run_claimed(turns: "Turns") -> None:
    """The turns of a claimed run after its claim's commit, then the runs its orchestration's next
    step handed to this task (the primary, the reviewer), claimed in that step's transaction."""
    here: list[Turns] = []
    heartbeat().add(turns)
    try:
        turns.execute(turns.go_on)
        keep_transcript(turns.transcript, turn=turns.turn)
        if is_brain_worker(turns.collaborator.name):  # its orchestration may be ready to move on
            here = ring_orchestrator(turns)
    except LostTurn:
        logger.info("run %s: turn %s is another worker's; stopping", turns.run.pk, turns.turn)
    finally:
        try:
            if not here:  # else the next run's model call reads it, the COMMIT of the step that claimed it
                await_commit()  # left unread only when the turn stopped on an error before its next statement
        except DatabaseError:
            logger.exception("run %s: the COMMIT before its model call failed", turns.run.pk)
        heartbeat().remove(turns)
        turns.mcp.release(still_active=turns.still_active)
        if connection.errors_occurred:  # the next task starts on a fresh connection
            connection.close()
    for next_turns in here:
        run_claimed(next_turns)


# The run a task starts on, in one statement, sent with its claim: the kernel's read of a claimed run
# joined to what the runtime needs of its own: the run's agent profile, then for a first turn who
# delegated its task (the handoff names them: kind, name) and a prompt's support worker's
# SubagentStart (starts.py).
_CLAIMED_RUN_SQL = actions.claimed_run_sql(
    also=f"{columns(AgentProfile, 'p')}, dc.kind, dc.name, {starts.START_COLUMNS}",
    join=(
        f"LEFT JOIN {AgentProfile._meta.db_table} p ON p.name = c.profile "
        f"LEFT JOIN {Delegation._meta.db_table} d ON d.delegate_id = c.id "
        f"LEFT JOIN {Collaborator._meta.db_table} dc ON dc.id = d.delegator_id {starts.START_JOIN}"
    ),
)


def ring_orchestrator(turns: Turns) -> "list[Turns]":
    """A worker of a prompt rested: its orchestration may be ready for the next step. Advanced here,
    after this run's last commit, rather than by one more task (with what that commit's
    transaction read for it, if it ended the turns); and the run that step starts (the primary, the
    reviewer) is claimed in the step's transaction, to run in this task too: two doorbell hops less
    between the last worker's answer and the primary's first turn. A failure here loses nothing
    (the periodic resume rings every running prompt, the reconciler every queued run, and a run
    claimed here and never run is reclaimed when its lease lapses)."""
    name = turns.collaborator.name
    return advance_after(str(turns.saga_id), name, worker=turns.worker, ahead=turns.orchestrator_read)
