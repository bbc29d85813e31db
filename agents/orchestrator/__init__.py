"""The orchestrator ("the Brain", DESIGN.md §7): a prompt becomes a plan, support workers run side by
side as delegations of the prompt's lead, a primary answers, and a review gate judges the answer.

Modules by concern: `models` (brains and prompts), `plans` (heuristic routing and the router's
answer, normalized), `handoffs` (HandoffPacket, WorkerResult, the shared formatter, the review
gate), `router` (the router model call), `actions` (submitting a prompt, loading brains), `steps`
(the durable state machine), `tasks`, `api` and `views`.
"""
