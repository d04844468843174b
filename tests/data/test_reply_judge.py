"""The default reply judge of the `match` labeler (`claim_judge`) must not call a contradicting
reply valid: the facts must agree and the claim (done / cannot / asks / informs) must agree.

The fixture, tests/data/fixtures/reply_pairs.jsonl: 115 pairs of real GPT-4o replies from the
shared tau-bench airline runs (tasks 0-24), hand-labelled (label 1 = a careful agent would
accept the draft in place of the reference): 47 contradictions (same facts, the claim flipped:
the confirm-or-offer reply before an action against the done reply after it; all label 0),
49 paraphrases (the same step in two trials, or a repeated reply; all label 1), 19 other (18
label 0: the same step or claim with other facts, an extra action, another task or context; 1
label 1). 22 of them (4 / 12 / 6) were labelled after the rules were frozen (note "held out").

Figures (python bench/reply_judge.py), all 115 pairs:

                                    overlap_judge     claim_judge
    agreement with the labels       0.739 (85/115)    0.835 (96/115)
    false accept, contradictions    0.128 (6/47)      0.000 (0/47)
    false accept, all label 0       0.200 (13/65)     0.123 (8/65)
    false reject, paraphrases       0.347 (17/49)     0.224 (11/49)

held out only (22): claim_judge 0/4 contradictions accepted, 2/10 label-0 accepted, 3/12
paraphrases rejected (overlap_judge 0/4, 2/10, 5/12). Without the claim check, the new fact and
F1 check alone accepts 11/47 contradictions. The rules were written while reading these runs,
so the 93 pairs labelled first are in-sample for them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specagent.core.types import DraftedStep, Message, StepKind
from specagent.runtime.labelers import (
    ASKS,
    CANNOT,
    DONE,
    INFORMS,
    PARTIAL,
    claim_judge,
    match_labels,
    overlap_judge,
    reply_claim,
    reply_facts,
)

FIXTURE = Path(__file__).parent / "fixtures" / "reply_pairs.jsonl"
PAIRS = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def rates(judge, pairs=PAIRS):
    said = [bool(judge(p["draft"], p["reference"])) for p in pairs]
    contra = [s for p, s in zip(pairs, said) if p["kind"] == "contradiction"]
    invalid = [s for p, s in zip(pairs, said) if p["label"] == 0]
    para = [s for p, s in zip(pairs, said) if p["kind"] == "paraphrase" and p["label"] == 1]
    return {
        "agreement": sum(s == bool(p["label"]) for p, s in zip(pairs, said)) / len(pairs),
        "false_accept_contradictions": sum(contra) / len(contra),
        "false_accept_all": sum(invalid) / len(invalid),
        "false_reject_paraphrases": 1 - sum(para) / len(para),
    }


# ---- the hand-labelled airline pairs ------------------------------------------------------


def test_fixture_is_hand_labelled_airline_pairs():
    assert len(PAIRS) >= 60
    for p in PAIRS:
        assert set(p) == {"draft", "reference", "label", "kind", "source", "note"}
        assert p["label"] in (0, 1) and p["kind"] in ("paraphrase", "contradiction", "other")
        side = r"run \d+ msg \d+ \(task \d+ trial \d\)"
        assert re.fullmatch(rf"draft {side}; reference {side}", p["source"]), p["source"]
        assert p["draft"].strip() and p["reference"].strip()
    assert all(p["label"] == 0 for p in PAIRS if p["kind"] == "contradiction")
    kinds = {k: sum(p["kind"] == k for p in PAIRS) for k in ("paraphrase", "contradiction", "other")}
    assert min(kinds.values()) >= 10


def test_claim_judge_never_accepts_a_contradiction_and_keeps_most_paraphrases():
    new = rates(claim_judge)
    assert new["false_accept_contradictions"] == 0.0  # measured 0/47
    assert new["false_reject_paraphrases"] <= 0.25  # the stated share; measured 11/49
    assert new["agreement"] >= 96 / 115
    assert new["false_accept_all"] <= 8 / 65


def test_claim_judge_does_better_than_the_overlap_judge_on_the_same_pairs():
    old, new = rates(overlap_judge), rates(claim_judge)
    assert old["false_accept_contradictions"] > 0  # the bug of issue 15
    assert new["false_accept_contradictions"] < old["false_accept_contradictions"]
    assert new["false_accept_all"] < old["false_accept_all"]
    assert new["agreement"] > old["agreement"]


@pytest.mark.parametrize("can, done", [
    ("The order W1007 can be updated. Please give me the new address.",
     "The order W1007 has been updated to the new address."),
    ("Your order W1007 can be updated to 12 Main St. Please confirm the new address.",
     "Your order W1007 has been updated to 12 Main St, the new address."),
])
def test_the_issue_example_is_rejected(can, done):
    """'the order can be updated, please give the address' vs 'the order has been updated'."""
    assert overlap_judge(can, done) and overlap_judge(done, can)  # the old judge accepted both ways
    assert (reply_claim(can), reply_claim(done)) == (ASKS, DONE)
    assert not claim_judge(can, done) and not claim_judge(done, can)


# ---- the claim rules, one by one ----------------------------------------------------------


@pytest.mark.parametrize("text, claim", [
    ("Your reservation ZFA04Y has been successfully cancelled.", DONE),
    ("I've updated the passenger name on 4WQ150.", DONE),
    ("The payment was processed using your gift card.", DONE),
    ("You are now booked on flight HAT041.", DONE),
    ("Your booking is confirmed.", DONE),
    ("Reservation ZFA04Y has not been cancelled.", CANNOT),
    ("I haven't changed anything yet.", CANNOT),
    ("Basic economy flights cannot be modified.", CANNOT),
    ("I'm unable to remove a passenger from a reservation.", CANNOT),
    ("This reservation is not eligible for a refund.", CANNOT),
    ("Could you please provide your user ID?", ASKS),
    ("Please confirm if you would like to proceed with the cancellation.", ASKS),
    ("Would you like me to cancel reservation ZFA04Y?", ASKS),
    ("Unfortunately, I cannot proceed without the reservation ID.", ASKS),
    ("Your reservation ZFA04Y is a one-way trip from JFK to SEA in economy.", INFORMS),
    ("I will proceed with the change now. Please hold on for a moment.", INFORMS),
    ("Your flight HAT123 has been delayed by two hours.", INFORMS),  # not an action of the agent
    # precedence: done > cannot > asks > informs; done with cannot is partial
    ("Your reservation ZFA04Y has been cancelled. Would you like to book a new flight?", DONE),
    ("I cannot change basic economy. Would you like me to transfer you to a human agent?", CANNOT),
    ("The bags have been added, but I cannot upgrade the cabin.", PARTIAL),
    # background clauses and questions do not assert
    ("I can only cancel it if it was booked within the last 24 hours. What is the reason?", ASKS),
    ("Since it was booked more than 24 hours ago, it cannot be cancelled.", CANNOT),
    ("Compensation is only for flights that were cancelled by the airline.", INFORMS),
    ("Was the reservation made within the last 24 hours?", ASKS),
    ("If you're unable to find it, please let me know which flight it was.", ASKS),
    # closings are skipped
    ("Your flight has been changed. If you need any further assistance, feel free to ask!", DONE),
    ("Is there anything else I can help you with?", INFORMS),
])
def test_reply_claim(text, claim):
    assert reply_claim(text) == claim


def test_facts_have_one_spelling():
    assert reply_facts("on 2024-05-20 at 07:00, $2,544.00") == reply_facts("on May 20th, 2024 at 7:00, $2544")
    assert reply_facts("1. **Flight HAT136**\n2. Flight HAT039") == {"hat136", "hat039"}
    assert "gift_card_7359776" in reply_facts("paid with gift_card_7359776.")


def test_match_labels_uses_the_claim_judge_by_default():
    ro = {"get": True}
    asked = Message(role="assistant", content="Would you like me to cancel reservation ZFA04Y?")
    done = Message(role="assistant", content="Your reservation ZFA04Y has been cancelled.")
    assert match_labels([DraftedStep(asked, StepKind.REPLY)], [done], ro) == [0]
    assert match_labels([DraftedStep(done, StepKind.REPLY)], [done], ro) == [1]
    assert match_labels([DraftedStep(asked, StepKind.REPLY)], [done], ro, judge=lambda d, r: True) == [1]


# ---- properties ---------------------------------------------------------------------------

ids = st.from_regex(r"\A[A-Z]{2}[0-9][A-Z0-9]{3}\Z")
amounts = st.integers(1, 9999)
dates = st.dates().map(lambda d: f"2024-{d.month:02d}-{d.day:02d}")
verbs = st.sampled_from([("cancel", "cancelled"), ("update", "updated"), ("change", "changed"),
                         ("upgrade", "upgraded"), ("modify", "modified")])
things = st.sampled_from(["reservation", "booking", "flight"])

DONE_T = ["Your {thing} {id} has been {pp}.", "I've {pp} {thing} {id}.", "{Thing} {id} was successfully {pp}.",
          "Your {thing} {id} is now {pp}.", "All set: your {thing} {id} has been {pp} as requested."]
ASKS_T = ["Would you like me to {v} {thing} {id}?", "Shall I {v} {thing} {id} now?",
          "Please confirm that you want {thing} {id} {pp}.", "Do you want me to {v} {thing} {id}?",
          "{Thing} {id} can be {pp}. Please provide the reason for the change.",
          "I can {v} {thing} {id} for you. Could you confirm the details first?"]
CANNOT_T = ["I cannot {v} {thing} {id} because it was booked more than 24 hours ago.",
            "Unfortunately, {thing} {id} is not eligible to be {pp}.",
            "I'm unable to {v} {thing} {id} under the current policy.",
            "Your {thing} {id} has not been {pp}: the fare does not allow it.",
            "I refuse to {v} {thing} {id} without the passenger's consent."]
AROUND = ["Thank you for your patience.", "The total was ${amount}.", "Your flight departs on {date} at 10:00.",
          "The fare difference is ${amount} per passenger.", "Your membership level is gold.",
          "If you need any further assistance, feel free to ask!", "Safe travels!"]


@st.composite
def claimed_pair(draw):
    """Two replies with the same facts and surrounding text and different claims."""
    v, pp = draw(verbs)
    thing = draw(things)
    fields = {"id": draw(ids), "v": v, "pp": pp, "thing": thing, "Thing": thing.capitalize(),
              "amount": draw(amounts), "date": draw(dates)}
    a, b = draw(st.sampled_from([(DONE_T, ASKS_T), (DONE_T, CANNOT_T), (ASKS_T, CANNOT_T),
                                 (ASKS_T, DONE_T), (CANNOT_T, DONE_T), (CANNOT_T, ASKS_T)]))
    before = draw(st.lists(st.sampled_from(AROUND), max_size=2))
    after = draw(st.lists(st.sampled_from(AROUND), max_size=2))
    sep = draw(st.sampled_from([" ", "\n", "\n\n"]))

    def reply(templates):
        core = draw(st.sampled_from(templates))
        return sep.join([*before, core, *after]).format(**fields)

    return reply(a), reply(b), fields


@settings(max_examples=300, deadline=None)
@given(claimed_pair())
def test_same_facts_opposite_claims_are_always_rejected(pair):
    draft, reference, _ = pair
    assert reply_claim(draft) != reply_claim(reference)
    assert not claim_judge(draft, reference)
    assert not claim_judge(reference, draft)


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(min_codepoint=9, max_codepoint=126), max_size=300), st.data())
def test_a_reply_equal_up_to_case_and_whitespace_is_accepted(reference, data):
    words = reference.split()
    n = len(words)
    seps = data.draw(st.lists(st.sampled_from([" ", "  ", "\n", "\t", " \n "]), min_size=n, max_size=n))
    flips = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    draft = "".join(s + (w.swapcase() if f else w) for s, w, f in zip(seps, words, flips))
    assert claim_judge(draft, reference)


@settings(max_examples=300, deadline=None)
@given(claimed_pair(), ids, st.booleans())
def test_a_reply_missing_an_id_of_the_reference_is_rejected(pair, other, replace):
    _, reference, fields = pair
    if other == fields["id"]:
        return
    draft = reference.replace(fields["id"], other if replace else "it")
    assert not claim_judge(draft, reference)
    assert claim_judge(reference, reference)
