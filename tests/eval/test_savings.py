"""The GPT-4o savings walk (`specagent/eval/savings.py`): its accounting on scripted drafters,
a handmade run and a recorded airline run. Every expected figure is worked out by hand from
the run's steps in the comments, not by the code under test."""

from __future__ import annotations

import argparse
import json

import pytest

from specagent.config import AirlineEnvSettings, EnvConfig
from specagent.core.classify import classify_tools, step_kind
from specagent.core.types import DraftedStep, Message, Segment, StepKind, ToolCall, Trajectory
from specagent.engines.scripted import ScriptedEngine
from specagent.eval.savings import Walk, bootstrap_share, simulate, totals
from specagent.runtime.labelers import match_assignment
from tests.data.conftest import AIRLINE_RUNS, AIRLINE_YAML
from tests.helpers.bench import load_bench

RO = {"get_user_details": True, "get_reservation_details": True, "cancel_reservation": False}
TOKENS = {"get_user_details": 10, "get_reservation_details": 20, "cancel_reservation": 30, "reply": 40}
DONE = "Your reservation R1 has been cancelled."


def tokens_by_name(message: Message) -> int:
    return TOKENS[message.tool_calls[0].name if message.tool_calls else "reply"]


def call(name: str, i: int, **arguments) -> Message:
    return Message("assistant", tool_calls=(ToolCall(f"c{i}", name, arguments),))


def tiny_run() -> Trajectory:
    """Four recorded steps: lookups A (10 tokens) and B (20), the write W (30), the reply T (40).
    Messages: 2 A, 4 B, 6 W, 8 T."""
    return Trajectory("tiny:1:0", "1", [], [
        Message("system", "policy"), Message("user", "Please cancel R1, I am u1."),
        call("get_user_details", 2, user_id="u1"), Message("tool", '{"user": "u1"}', tool_call_id="c2"),
        call("get_reservation_details", 4, reservation_id="R1"), Message("tool", '{"id": "R1"}', tool_call_id="c4"),
        call("cancel_reservation", 6, reservation_id="R1"),
        Message("tool", '{"status": "cancelled"}', tool_call_id="c6"),
        Message("assistant", DONE), Message("user", "Thanks ###STOP###"),
    ])


def recorded(run: Trajectory, index: int, read_only: dict[str, bool]) -> DraftedStep:
    """The recorded step at message ``index`` as a drafted step (a lookup with its observations)."""
    message = run.messages[index]
    kind = step_kind(message, read_only)
    observations = ()
    if kind is StepKind.READ:
        end = index + 1
        while end < len(run.messages) and run.messages[end].role == "tool":
            end += 1
        observations = tuple(run.messages[index + 1 : end])
    return DraftedStep(message, kind, observations)


def replayer(read_only: dict[str, bool], budget: int, log: list | None = None):
    """Drafts the recorded steps from the cut on, by the DRAFT rules: lookups, then the first held step."""
    def draft(requests):
        out = []
        for run, cut, context in requests:
            if log is not None:
                log.append((cut, list(context)))
            steps, i = [], cut
            while i < len(run.messages) and len(steps) < budget:
                step = recorded(run, i, read_only)
                steps.append(step)
                if step.kind is not StepKind.READ:
                    break
                i = next(j for j in range(i + 1, len(run.messages)) if run.messages[j].role == "assistant")
            out.append(Segment(cut, tuple(steps), "held" if steps[-1].held else "max_steps"))
        return out
    return draft


def as_step(run: Trajectory, entry) -> DraftedStep:
    if isinstance(entry, int):  # a recorded step
        return recorded(run, entry, RO)
    if isinstance(entry, DraftedStep):
        return entry
    return DraftedStep(entry, StepKind.READ, (Message("tool", "{}", tool_call_id=entry.tool_calls[0].id),))


def scripted(plan, log: list | None = None):
    """Drafts ``plan[(cut, round at that cut)]``: a list of message indices of the tiny run
    (recorded steps), drafted steps, or Messages (lookups of its own, observed as "{}")."""
    seen: dict[int, int] = {}

    def draft(requests):
        out = []
        for run, cut, context in requests:
            if log is not None:
                log.append((cut, list(context)))
            n = seen[cut] = seen.get(cut, -1) + 1
            steps = tuple(as_step(run, s) for s in plan[(cut, n)])
            out.append(Segment(cut, steps, "held" if steps and steps[-1].held else "max_steps"))
        return out
    return draft


WRONG = call("get_user_details", 99, user_id="nobody")
WRONG_WRITE = DraftedStep(call("cancel_reservation", 6, reservation_id="R2"), StepKind.WRITE)


def wrong_lookup(requests):
    """Always drafts one lookup GPT-4o never made."""
    step = DraftedStep(WRONG, StepKind.READ, (Message("tool", "{}", tool_call_id="c99"),))
    return [Segment(cut, (step,), "max_steps") for _, cut, _ in requests]


def accept_all(run, context, segment):
    return len(segment.verifiable)


def run_tiny(draft, verify=None):
    return simulate([tiny_run()], draft, verify, tokens_by_name, lambda run: RO)[0]


def figures(r) -> tuple:
    return (r.supplied_tokens, r.repaired_tokens, r.skipped_tokens, r.unreached_tokens,
            r.rounds, r.verify_passes, r.repaired_steps, r.false_accepts, r.followed_to_end)


# ------------------------------------------------------------------ the handmade run


def test_an_exact_replayer_supplies_every_token():
    # budget 4: round 1 at message 2 drafts A, B, W (W held, approved); round 2 at 8 drafts T
    r = run_tiny(replayer(RO, 4))
    assert (r.steps, r.tokens) == (4, 100)
    assert figures(r) == (100, 0, 0, 0, 2, 2, 0, 0, True)
    assert [t["supplied"] for t in r.trace] == [[2, 4, 6], [8]]
    # budget 2: A, B (the budget, accepted whole: no repair), then W, then T
    r = run_tiny(replayer(RO, 2))
    assert figures(r) == (100, 0, 0, 0, 3, 3, 0, 0, True)
    assert [t["cut"] for t in r.trace] == [2, 6, 8]


def test_a_wrong_lookup_every_round_supplies_nothing_and_repairs_every_step():
    r = run_tiny(wrong_lookup)
    assert figures(r) == (0, 100, 0, 0, 4, 4, 4, 0, True)
    assert [t["repaired"] for t in r.trace] == [2, 4, 6, 8]
    assert (r.drafted_steps, r.accepted_steps) == (4, 0)


def test_a_verifier_accepting_a_wrong_step_is_one_false_accept_and_ends_the_run():
    # round 1 drafts A, B, then the wrong write cancel(R2); the verifier approves all three
    plan = {(2, 0): [2, 4, WRONG_WRITE], (8, 0): [8]}
    r = run_tiny(scripted(plan), accept_all)
    # A and B (10 + 20) were right and approved; W and T (30 + 40) are never reached
    assert figures(r) == (30, 0, 0, 70, 1, 1, 0, 1, False)
    assert r.trace[0]["false_accept"]["tool_calls"][0]["function"]["arguments"] == '{"reservation_id": "R2"}'
    # the same drafts under the oracle verdict: W rejected and repaired (30), then T drafted (40)
    r = run_tiny(scripted(plan))
    assert figures(r) == (70, 30, 0, 0, 2, 2, 1, 0, True)


def test_a_verifier_that_accepts_a_wrong_lookup_stops_at_the_first_round():
    r = run_tiny(wrong_lookup, accept_all)
    assert figures(r) == (0, 0, 0, 100, 1, 1, 0, 1, False)


def test_a_lookup_drafted_ahead_waits_and_the_repair_fills_the_gap():
    # round 1 at 2 drafts B (stands for message 4) then a wrong lookup: B supplied, the
    # repair is A (the first recorded step nothing stands for), and the walk moves past B
    log: list = []
    r = run_tiny(scripted({(2, 0): [4, WRONG], (6, 0): [6], (8, 0): [8]}, log))
    assert figures(r) == (90, 10, 0, 0, 3, 3, 1, 0, True)
    assert r.trace[0]["supplied"] == [4] and r.trace[0]["repaired"] == 2
    run = tiny_run()
    assert [c for c, _ in log] == [2, 6, 8] and log[1][1] == run.messages[:6]


def test_a_lookup_drafted_ahead_joins_the_context_until_the_walk_reaches_it():
    # round 1 drafts only B and ends at its budget: accepted whole, nothing repaired, and the
    # walk still stands before A, with B (and its observation) in the committed context
    log: list = []
    r = run_tiny(scripted({(2, 0): [4], (2, 1): [2], (6, 0): [6], (8, 0): [8]}, log))
    assert figures(r) == (100, 0, 0, 0, 4, 4, 0, 0, True)
    run = tiny_run()
    assert [c for c, _ in log] == [2, 2, 6, 8]
    assert log[1][1] == [*run.messages[:2], run.messages[4], run.messages[5]]
    assert [t["supplied"] for t in r.trace] == [[4], [2], [6], [8]]


def test_a_repeated_lookup_drafted_ahead_is_not_valid_again():
    # B is supplied in round 1; drafting B again in round 2 matches nothing left: rejected, A repaired
    r = run_tiny(scripted({(2, 0): [4], (2, 1): [4], (6, 0): [6], (8, 0): [8]}))
    assert figures(r) == (90, 10, 0, 0, 4, 4, 1, 0, True)
    assert r.trace[1]["repaired"] == 2


def test_an_approved_write_skips_the_lookups_no_draft_stood_for():
    # round 1 drafts B then W: both valid (a lookup of the window, then its action); A is skipped
    r = run_tiny(scripted({(2, 0): [4, 6], (8, 0): [8]}))
    assert figures(r) == (90, 0, 10, 0, 2, 2, 0, 0, True)
    assert r.trace[0]["skipped"] == [2] and r.skipped_steps == 1


def test_an_empty_draft_is_repaired_without_a_verify_pass():
    def nothing(requests):
        return [Segment(cut, (), "context_length") for _, cut, _ in requests]

    def never(run, context, segment):
        raise AssertionError("an empty draft has nothing to verify")

    r = run_tiny(nothing, never)
    assert figures(r) == (0, 100, 0, 0, 4, 0, 4, 0, True)


def test_a_draft_ended_by_a_repeated_lookup_has_its_next_step_repaired_in_the_same_round():
    """The drafter's lookup A, then A again (`draft_stop_repeats` ends the draft before it): A is
    supplied and GPT-4o writes B in that round, as the runtime's S would; the next rounds
    replay the rest."""
    def repeat_then_replay(requests):
        out = []
        for run, cut, context in requests:
            if cut == 2:
                out.append(Segment(cut, (recorded(run, 2, RO),), "repeat"))
            else:
                out.extend(replayer(RO, 4)([(run, cut, context)]))
        return out

    r = run_tiny(repeat_then_replay)
    assert r.trace[0]["supplied"] == [2] and r.trace[0]["repaired"] == 4
    assert figures(r) == (80, 20, 0, 0, 3, 3, 1, 0, True)


def test_a_verdict_is_clamped_to_the_verifiable_steps():
    r = run_tiny(replayer(RO, 4), lambda run, context, segment: 99)
    assert figures(r) == (100, 0, 0, 0, 2, 2, 0, 0, True)
    r = run_tiny(replayer(RO, 4), lambda run, context, segment: -3)
    assert figures(r) == (0, 100, 0, 0, 4, 4, 4, 0, True)


def test_match_assignment_names_the_recorded_step_of_each_lookup():
    run = tiny_run()
    reference = [run.messages[i] for i in (2, 4, 6, 8)]
    b, a, w = (recorded(run, i, RO) for i in (4, 2, 6))
    assert match_assignment([b, a, w], reference, RO) == [1, 0, 2]
    assert match_assignment([b, b, w], reference, RO) == [1, None, 2]


def test_totals_and_the_bootstrap_interval():
    runs = [run_tiny(replayer(RO, 4)), run_tiny(wrong_lookup)]
    t = totals(runs)
    assert (t["runs"], t["tokens"], t["supplied_tokens"], t["repaired_tokens"]) == (2, 200, 100, 100)
    assert t["supplied_share"] == 0.5 and t["rounds_per_run"] == 3 and t["verify_passes_per_run"] == 3
    assert t["followed_to_end"] == 2 and t["false_accepts_per_run"] == 0
    low, high = t["supplied_share_ci95"]
    assert low == 0.0 and high == 1.0  # two runs, 0% and 100%: resamples of both extremes occur
    assert bootstrap_share([runs[0], runs[0]]) == [1.0, 1.0]


# ------------------------------------------------------------------ a recorded airline run


@pytest.fixture(scope="module")
def airline_run():
    """Task 22 trial 2: steps T L(user) L(reservation) T L(search) T T L(think) T T W(update) T."""
    if not AIRLINE_RUNS.exists():
        pytest.skip(f"real airline runs not found at {AIRLINE_RUNS} (set SPECAGENT_AIRLINE_RUNS)")
    from specagent.data.importers import convert_files

    runs, _ = convert_files([AIRLINE_RUNS], tools_yaml=AIRLINE_YAML, model="gpt-4o")
    run = next(t for t in runs if t.id.endswith(":22:2"))
    return run, classify_tools(run.tools, (), (), strict=False)


def chars(message: Message) -> int:
    return len(message.content or "") + sum(len(json.dumps(c.arguments)) for c in message.tool_calls)


def test_the_recorded_run_is_the_one_the_expectations_were_worked_out_on(airline_run):
    run, ro = airline_run
    letter = {StepKind.READ: "L", StepKind.REPLY: "T", StepKind.WRITE: "W"}
    kinds = "".join(letter[step_kind(m, ro)] for m in run.messages if m.role == "assistant")
    assert kinds == "TLLTLTTLTTWT"


def test_an_exact_replayer_on_the_recorded_run(airline_run):
    run, ro = airline_run
    total = sum(chars(m) for m in run.messages if m.role == "assistant")
    r = simulate([run], replayer(ro, 4), None, chars, lambda _: ro)[0]
    # rounds: {T} {L L T} {L T} {T} {L T} {T} {W} {T}
    assert (r.steps, r.tokens, r.supplied_tokens, r.rounds, r.verify_passes, r.repaired_steps) == (
        12, total, total, 8, 8, 0)
    # budget 1: every step its own round; the lookups are accepted whole, so nothing is repaired
    r = simulate([run], replayer(ro, 1), None, chars, lambda _: ro)[0]
    assert (r.supplied_tokens, r.rounds, r.repaired_steps) == (total, 12, 0)


def test_a_wrong_lookup_on_the_recorded_run(airline_run):
    run, ro = airline_run
    total = sum(chars(m) for m in run.messages if m.role == "assistant")
    r = simulate([run], wrong_lookup, None, chars, lambda _: ro)[0]
    assert (r.supplied_tokens, r.repaired_tokens, r.rounds, r.repaired_steps, r.followed_to_end) == (
        0, total, 12, 12, True)
    r = simulate([run], wrong_lookup, accept_all, chars, lambda _: ro)[0]
    assert (r.supplied_tokens, r.unreached_tokens, r.rounds, r.false_accepts) == (0, total, 1, 1)


def test_lookups_out_of_order_on_the_recorded_run(airline_run):
    run, ro = airline_run
    cuts = [i for i, m in enumerate(run.messages) if m.role == "assistant"]
    user, reservation, reply = cuts[1], cuts[2], cuts[3]
    exact = replayer(ro, 4)

    def swapped(requests):
        out = []
        for request, segment in zip(requests, exact(requests)):
            if request[1] == user:  # the reservation lookup first, then the user's, then the reply
                segment = Segment(user, (recorded(run, reservation, ro), recorded(run, user, ro),
                                         recorded(run, reply, ro)), "held")
            out.append(segment)
        return out

    r = simulate([run], swapped, None, chars, lambda _: ro)[0]
    total = sum(chars(m) for m in run.messages if m.role == "assistant")
    assert (r.supplied_tokens, r.rounds, r.repaired_steps) == (total, 8, 0)
    assert r.trace[1]["supplied"] == [reservation, user, reply]


def test_walk_stands_before_the_first_step_after_the_first_user_turn(airline_run):
    run, ro = airline_run
    walk = Walk(run, chars, ro)
    assert walk.cut == 2 and walk.context() == run.messages[:2]


# ------------------------------------------------------------------ the bench's live drafter


def test_the_bench_drafts_in_the_live_airline_env_restored_to_each_point(airline_run):
    """bench/gpt4o_savings.py's drafter on a scripted engine that writes GPT-4o's next step:
    every round runs in a live airline env restored to the walk's point, lookups for real."""
    run, ro = airline_run
    bench = load_bench("gpt4o_savings")
    steps = [m for m in run.messages if m.role == "assistant"]

    def gpt4o_next(messages, tools):  # the recorded step after as many assistant steps as the context holds
        return steps[sum(m.role == "assistant" for m in messages)]

    airline = AirlineEnvSettings(data_dir=str(AIRLINE_RUNS.parent), runs=str(AIRLINE_RUNS))
    env = EnvConfig(name="airline", airline=airline)
    total = sum(chars(m) for m in steps)
    recorded_obs = {m.content for m in run.messages if m.role == "tool"}
    # with the repeat rule too: GPT-4o never repeats a read within a user turn, so nothing changes
    for stop_repeats in (False, True):
        args = argparse.Namespace(max_draft_steps=4, max_tokens=192, stop_repeats=stop_repeats)
        live = bench.live_drafter(ScriptedEngine(gpt4o_next), env, args, None)
        observed: list[Message] = []

        def draft(requests):
            segments = live(requests)
            observed.extend(o for s in segments for step in s.steps for o in step.observations)
            return segments

        r = simulate([run], draft, None, chars, lambda _: ro)[0]
        # as the exact replayer above: {T} {L L T} {L T} {T} {L T} {T} {W} {T}
        assert (r.supplied_tokens, r.tokens, r.rounds, r.repaired_steps, r.false_accepts) == (total, total, 8, 0, 0)
        # the drafted lookups ran in the live env: their observations are GPT-4o's recorded ones
        assert len(observed) == 4 and all(m.content in recorded_obs for m in observed)  # user, reservation, search, think


def test_the_bench_tells_a_likelihood_head_from_a_lora_head(tmp_path):
    """`--head` takes either kind: a dir holding `likelihood_head.json` (as `specagent train verdict`
    writes it, under head/) is a likelihood head; anything else is left to the LoRA head's loader.
    A degenerate likelihood head is refused at its calibrated threshold, not at one given explicitly."""
    from specagent.core.errors import ConfigError
    from specagent.engines.likelihood_head import LikelihoodHead

    bench = load_bench("gpt4o_savings")
    assert bench.likelihood_head(str(tmp_path)) is None  # e.g. a LoRA head's export dir
    head = LikelihoodHead(weights=(1.0,) * 7, bias=0.0, mean=(0.0,) * 7, scale=(1.0,) * 7, threshold=0.4,
                          calibration_tasks=("16", "17"))
    head.save(tmp_path / "verdict" / "head")
    loaded = bench.likelihood_head(str(tmp_path / "verdict"))
    assert loaded.threshold == 0.4 and loaded.calibration_tasks == ("16", "17")
    LikelihoodHead(**{**head.__dict__, "degenerate": True}).save(tmp_path / "bad")
    with pytest.raises(ConfigError, match="degenerate"):
        bench.likelihood_head(str(tmp_path / "bad"))
    assert bench.likelihood_head(str(tmp_path / "bad"), threshold=0.9).degenerate
