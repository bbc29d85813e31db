"""The orchestrator's pure parts: the heuristic, the router's answer normalized, the WorkerResult
normalizer, the shared formatter and the review gate."""

import json
import logging
import time
from types import SimpleNamespace

import pytest

from agents.orchestrator import handoffs, plans

BRAIN = SimpleNamespace(
    name="units",
    roles={"coder": "p-coder", "tester": "p-tester", "writer": "p-writer", "researcher": "p-r", "review": "p-review"},
    signals={
        "coder": ["implement", r"\bapi\b"],
        "tester": [r"\btests?\b"],
        "writer": ["changelog"],
        "researcher": ["compare"],
        "review": ["review"],
    },
    default_primary="researcher",
    review_role="review",
    review_by_default=False,
    max_parallel_agents=2,
)
ROUTING = plans.Routing.of(BRAIN)


def test_the_heuristic_makes_the_strongest_match_primary_and_the_others_support_it() -> None:
    plan = plans.heuristic_plan("Implement the API change, with tests and a changelog; then review it.", ROUTING)
    assert plan["primary_role"] == "coder"
    assert [w["role"] for w in plan["workers"]] == ["tester", "writer"]
    assert plan["requires_review"] is True  # the review signal matched
    assert plan["source"] == "heuristic"
    assert "implement" in plan["reason"]


def test_the_heuristic_with_no_signal_uses_the_default_primary_alone() -> None:
    plan = plans.heuristic_plan("Hello there", ROUTING)
    assert (plan["primary_role"], plan["workers"], plan["requires_review"]) == ("researcher", [], False)


def test_the_heuristic_caps_the_workers() -> None:
    plan = plans.heuristic_plan("implement api, tests, changelog, compare", ROUTING)
    assert len(plan["workers"]) == 2


def test_the_heuristic_keeps_to_the_allowed_roles() -> None:
    plan = plans.heuristic_plan("implement the api with tests", plans.Routing.of(BRAIN, allowed={"tester", "writer"}))
    assert plan["primary_role"] == "tester" and plan["workers"] == []


def test_a_default_primary_not_allowed_is_stood_in_for_by_a_support_role_not_the_reviewer() -> None:
    brain = SimpleNamespace(**{**vars(BRAIN), "roles": {"review": "p-review", **BRAIN.roles}})  # the reviewer first
    routing = plans.Routing.of(brain, allowed={"review", "writer"})  # the default primary cannot see images
    plan = plans.heuristic_plan("Hello there", routing)
    assert (routing.default_primary, plan["primary_role"], routing.review_role) == ("writer", "writer", "review")


# Backtracking that no engine cuts short: each run of letters splits every way before `$` fails at
# the "!", for 2^60 ways or so; and a pattern a brain could well hold, which `re` runs for minutes on
# such a prompt and `regex` answers at once (no match).
CATASTROPHIC = r"(\w|\w\w)+$"
BACKTRACKING = r"(\w+\s?)+$"
PATHOLOGICAL = "Implement it, with tests: " + "a" * 60 + "!"


@pytest.mark.timeout(10)  # a signal that runs for ever fails the test here, rather than holding the suite
def test_a_signal_that_runs_too_long_counts_as_no_match_and_the_plan_names_its_role(
    caplog: pytest.LogCaptureFixture,
) -> None:
    signals = {**BRAIN.signals, "tester": [CATASTROPHIC, r"\btests?\b"], "writer": [BACKTRACKING]}
    routing = plans.Routing.of(SimpleNamespace(**{**vars(BRAIN), "signals": signals}))
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="agents.orchestrator.plans"):
        plan = plans.heuristic_plan(PATHOLOGICAL, routing)

    assert time.monotonic() - started < 5
    assert plan["primary_role"] == "coder"
    # The tester's other signal still matched; the writer's only one does not match (at once).
    assert plan["workers"] == [
        {"role": "tester", "goal": plans.default_goal("tester", "coder"), "reason": r"signals: \btests?\b"}
    ]
    assert plan["signals_timed_out"] == ["tester"]
    assert [r.getMessage() for r in caplog.records] == [
        f"Brain 'units', role 'tester': the signal {CATASTROPHIC!r} took too long to match a prompt."
    ]
    # The router's plan, when it is the one kept, says so too.
    routed = plans.normalize_router_decision(json.dumps({"primary_role": "writer"}), routing, plan)
    assert (routed["source"], routed["signals_timed_out"]) == ("router", ["tester"])


def test_a_signal_saved_before_it_was_checked_that_does_not_compile_counts_as_no_match(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A brain saved while `re` read its signals may hold one that `regex` does not compile (it is
    refused at load since): that signal counts as no match, and the prompt is routed."""
    signals = {**BRAIN.signals, "tester": ["[[:foo:]]"]}
    routing = plans.Routing.of(SimpleNamespace(**{**vars(BRAIN), "signals": signals}))

    with caplog.at_level(logging.WARNING, logger="agents.orchestrator.plans"):
        plan = plans.heuristic_plan("implement it, with tests", routing)

    assert (plan["primary_role"], plan["workers"], "signals_timed_out" in plan) == ("coder", [], False)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["Brain 'units', role 'tester'"]
    assert "does not compile" in caplog.records[0].getMessage()


FALLBACK = plans.heuristic_plan("implement the api with tests", ROUTING)


def test_a_valid_router_answer_is_the_plan() -> None:
    answer = json.dumps(
        {
            "primary_role": "writer",
            "workers": [{"role": "researcher", "goal": "Find the clients.", "reason": "they break"}],
            "requires_review": True,
            "reason": "docs first",
        }
    )
    plan = plans.normalize_router_decision(answer, ROUTING, FALLBACK)
    assert plan == {
        "primary_role": "writer",
        "workers": [{"role": "researcher", "goal": "Find the clients.", "reason": "they break"}],
        "requires_review": True,
        "reason": "docs first",
        "source": "router",
    }


def test_a_fenced_router_answer_is_read() -> None:
    answer = 'Here:\n```json\n{"primary_role": "coder", "workers": []}\n```'
    plan = plans.normalize_router_decision(answer, ROUTING, FALLBACK)
    assert plan["source"] == "router" and plan["primary_role"] == "coder"


def test_invalid_json_falls_back_to_the_heuristic_and_says_why() -> None:
    plan = plans.normalize_router_decision("I think the coder should do it.", ROUTING, FALLBACK)
    assert plan["source"] == "heuristic" and plan["primary_role"] == FALLBACK["primary_role"]
    assert "not a JSON object" in plan["router_error"]


def test_no_router_answer_falls_back_with_the_error() -> None:
    plan = plans.normalize_router_decision(None, ROUTING, FALLBACK, error="every router candidate failed")
    assert plan["source"] == "heuristic" and plan["router_error"] == "every router candidate failed"


def test_an_unknown_primary_falls_back() -> None:
    plan = plans.normalize_router_decision('{"primary_role": "wizard", "workers": []}', ROUTING, FALLBACK)
    assert plan["source"] == "heuristic" and "wizard" in plan["router_error"]


def test_unknown_worker_roles_are_dropped() -> None:
    answer = json.dumps(
        {"primary_role": "coder", "workers": [{"role": "wizard"}, {"role": "tester", "goal": "g"}, {"role": "review"}]}
    )
    plan = plans.normalize_router_decision(answer, ROUTING, FALLBACK)
    assert [w["role"] for w in plan["workers"]] == ["tester"]
    assert plan["dropped"] == ["wizard", "review"]


def test_workers_over_the_cap_are_cut() -> None:
    roles = ["tester", "writer", "researcher"]
    answer = json.dumps({"primary_role": "coder", "workers": [{"role": r} for r in roles]})
    plan = plans.normalize_router_decision(answer, ROUTING, FALLBACK)
    assert [w["role"] for w in plan["workers"]] == ["tester", "writer"]
    assert plan["over_cap"] == ["researcher"]
    assert all(w["goal"] for w in plan["workers"])  # a missing goal gets the default one


def test_forced_roles_skip_review_and_make_the_first_primary() -> None:
    plan = plans.forced_plan(["tester", "coder"])
    assert plan["primary_role"] == "tester" and plan["requires_review"] is False
    assert [w["role"] for w in plan["workers"]] == ["tester", "coder"]


PACKET = handoffs.handoff(prompt_id="p1", slot="tester", goal="Test it.", original_prompt="Do it", expected="JSON")


def test_a_handoff_is_self_contained() -> None:
    assert PACKET["task"] == {"id": "task:p1:tester", "parent_id": "prompt:p1", "goal": "Test it.",
                              "original_prompt": "Do it"}  # fmt: skip
    task = handoffs.support_worker_task(PACKET)
    assert "Do it" in task and json.dumps(PACKET) in task


def test_the_expected_json_is_normalized_with_the_handoff_ids() -> None:
    output = {
        "progress": {"status": "partial"},
        "summary": "Half done.",
        "risks": "flaky",
        "task_id": "forged",
        "artifacts": [{"kind": "check", "uri": "t.py", "status": "failed"}, 42, {"label": "no uri"}],
        "nextQuestions": ["Why?"],
    }
    result = handoffs.normalize_worker_result(output, PACKET)
    assert result == {
        "handoff_id": "handoff:p1:tester",
        "task_id": "task:p1:tester",
        "parent_id": "prompt:p1",
        "progress": {"status": "partial"},
        "summary": "Half done.",
        "artifacts": [{"kind": "check", "uri": "t.py", "status": "failed"}],
        "risks": ["flaky"],
        "next_questions": ["Why?"],
    }


def known_artifacts(names: list[str]) -> tuple[dict[str, dict[str, object]], list[str]]:
    """A saga holding spec.md only (the real resolver is tested in test_references)."""
    spec: dict[str, object] = {"kind": "artifact", "uri": "/api/v1/sagas/s1/artifacts/spec.md", "label": "spec.md"}
    spec["name"] = "spec.md"
    refs: dict[str, dict[str, object]] = {"spec.md": spec}
    return {n: refs[n] for n in names if n in refs}, [n for n in names if n not in refs]


def test_artifacts_a_worker_names_become_references_and_unknown_names_risks() -> None:
    output = {
        "summary": "Done.",
        "risks": ["flaky"],
        "artifacts": [
            "spec.md",
            {"kind": "artifact", "uri": "@artifact:spec.md", "label": "the spec"},  # the same one again
            {"kind": "artifact", "name": "ghost.md"},
            "artifact:ghost.md",
            {"kind": "check", "uri": "t.py", "status": "failed"},
        ],
    }
    seen: list[list[str]] = []

    def resolve(names: list[str]) -> tuple[dict[str, dict[str, object]], list[str]]:
        seen.append(names)
        return known_artifacts(names)

    result = handoffs.normalize_worker_result(output, PACKET, resolve=resolve)

    assert seen == [["spec.md", "ghost.md"]]  # one lookup, each name once
    assert result["artifacts"] == [
        {"kind": "artifact", "uri": "/api/v1/sagas/s1/artifacts/spec.md", "label": "spec.md", "name": "spec.md"},
        {"kind": "check", "uri": "t.py", "status": "failed"},
    ]
    assert result["risks"] == [
        "flaky",
        "Artifact ghost.md is not in this saga: the result names it, nothing was attached.",
    ]
    # A label the worker gave is kept; nothing to resolve means no lookup; no resolver finds nothing.
    labelled = handoffs.normalize_worker_result(
        {"summary": "x", "artifacts": [{"kind": "artifact", "uri": "spec.md", "label": "the spec"}]}, PACKET,
        resolve=known_artifacts,
    )  # fmt: skip
    assert labelled["artifacts"][0]["label"] == "the spec"
    assert handoffs.normalize_worker_result({"summary": "x"}, PACKET, resolve=resolve)["artifacts"] == []
    assert len(seen) == 1
    unresolved = handoffs.normalize_worker_result({"summary": "x", "artifacts": ["spec.md"]}, PACKET)
    assert unresolved["artifacts"] == [] and "spec.md" in unresolved["risks"][0]


def test_json_in_text_is_read() -> None:
    result = handoffs.normalize_worker_result('{"summary": "ok", "progress": {"status": "done?"}}', PACKET)
    assert result["summary"] == "ok" and result["progress"] == {"status": "completed"}


def test_plain_text_becomes_the_summary() -> None:
    result = handoffs.normalize_worker_result("  All twelve cases pass.  ", PACKET)
    assert result["summary"] == "All twelve cases pass." and result["progress"]["status"] == "completed"
    assert result["risks"] == [] and result["task_id"] == "task:p1:tester"


def test_a_failed_worker_is_a_failed_result_with_the_error_in_risks() -> None:
    result = handoffs.failed_worker_result(PACKET, "Every model candidate failed.")
    assert result["progress"] == {"status": "failed"} and result["risks"] == ["Every model candidate failed."]


def executed(role: str, status: str = "completed", **extra: object) -> dict[str, object]:
    packet = handoffs.handoff(prompt_id="p1", slot=role, goal=f"{role} goal", original_prompt="x", expected="")
    result = handoffs.normalize_worker_result({"summary": f"{role} says", "progress": {"status": status}, **extra},
                                              packet)  # fmt: skip
    return handoffs.executed(result, role=role, goal=f"{role} goal")


def test_the_formatter_writes_one_block_per_result() -> None:
    text = handoffs.format_worker_results(
        [executed("tester", risks=["flaky"], next_questions=["400?"]), executed("writer")]
    )
    assert text.split("\n\n")[0] == "\n".join(
        [
            "### tester (completed)",
            "Task: task:p1:tester -> prompt:p1",
            "Goal: tester goal",
            "Progress: completed: tester says",
            "Summary: tester says",
            "Risks:",
            "- flaky",
            "Open questions:",
            "- 400?",
        ]
    )
    assert "### writer (completed)" in text and "- none" in text


def test_the_gate_keeps_a_valid_decision() -> None:
    review = handoffs.gate_review({"decision": "changes_requested", "confidence": 0.5,
                                   "findings": [{"severity": "high", "title": "t", "detail": "d"}]},
                                  [executed("tester")], policy="blocked")  # fmt: skip
    assert review["decision"] == "changes_requested" and review["findings"][0]["severity"] == "high"
    assert review["source"] == "reviewer"


def test_the_gate_demotes_an_approval_over_a_failed_check_or_worker() -> None:
    failing = executed("tester", artifacts=[{"kind": "check", "uri": "t.py", "label": "suite", "status": "failed"}])
    review = handoffs.gate_review({"decision": "approve"}, [failing], policy="blocked")
    assert review["decision"] == "changes_requested" and "check failed: suite" in review["residual_risks"]
    review = handoffs.gate_review('{"decision": "approve"}', [executed("coder", status="failed")], policy="blocked")
    assert review["decision"] == "changes_requested" and "worker coder failed" in review["residual_risks"]


def test_a_missing_or_malformed_review_follows_the_policy() -> None:
    assert handoffs.gate_review(None, [], policy="blocked")["decision"] == "blocked"
    assert handoffs.gate_review("looks fine", [], policy="changes_requested")["decision"] == "changes_requested"
    assert handoffs.gate_review({"decision": "lgtm"}, [], policy="blocked")["source"] == "policy"


def test_the_review_is_merged_into_the_answer() -> None:
    review = handoffs.gate_review({"decision": "approve", "residual_risks": ["partner sync"]}, [], policy="blocked")
    assert handoffs.merge_review("Do X.", review) == "Do X.\n\nReview: approve\n- risk: partner sync"


def test_the_gate_reads_decisions_and_severities_whatever_their_case_and_spaces() -> None:
    findings = [{"severity": s, "title": "t", "detail": "d"} for s in ("HIGH", " Medium ", "Low\n", "urgent", None)]
    review = handoffs.gate_review({"decision": " Changes_Requested ", "findings": findings}, [], policy="blocked")
    assert review["decision"] == "changes_requested" and review["source"] == "reviewer"
    assert [f["severity"] for f in review["findings"]] == ["high", "medium", "low", "info", "info"]
    assert handoffs.gate_review('{"decision": "APPROVE"}', [], policy="blocked")["decision"] == "approve"
    assert handoffs.gate_review({"decision": ["approve"]}, [], policy="blocked")["source"] == "policy"


def test_a_failed_check_or_worker_demotes_an_approval_whatever_its_case() -> None:
    failing = executed("tester", artifacts=[{"kind": " Check", "uri": "t.py", "label": "suite", "status": "FAILED"}])
    review = handoffs.gate_review({"decision": "Approve"}, [failing], policy="blocked")
    assert review["decision"] == "changes_requested" and "check failed: suite" in review["residual_risks"]
    failed = executed("coder", status=" Failed ")
    assert failed["status"] == "failed"
    review = handoffs.gate_review({"decision": "approve"}, [failed], policy="blocked")
    assert review["decision"] == "changes_requested" and "worker coder failed" in review["residual_risks"]


def test_an_artifact_kind_is_read_whatever_its_case() -> None:
    artifacts = [{"kind": "Artifact ", "uri": "spec.md"}, {"kind": "ARTIFACT", "name": "x.md"}]
    output = {"summary": "x", "artifacts": artifacts}
    result = handoffs.normalize_worker_result(output, PACKET, resolve=known_artifacts)
    assert [a["uri"] for a in result["artifacts"]] == ["/api/v1/sagas/s1/artifacts/spec.md"]
    assert result["risks"] == ["Artifact x.md is not in this saga: the result names it, nothing was attached."]
