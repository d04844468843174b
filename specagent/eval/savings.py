"""What SpecAgent would have saved a recorded strong run: an offline walk over the run.

The recorded run plays the strong model S: its repair at a cut point is its recorded next
step, and the tokens of that step are what S decodes. A drafter drafts at each point the
walk reaches (through an injected function, e.g. against a live environment restored to
that point), a verdict accepts a prefix of the draft (an injected verifier, or the oracle),
and the `match` labeler against the recorded continuation is the oracle that says which
accepted steps were right.

One round, with the walk standing before recorded step ``pos`` (the first one nothing has
stood for yet):

1. The committed context is the recorded messages before ``pos`` plus the approved drafted
   lookups that stand for recorded lookups further on (see 3), with their observations.
2. The reference is the recorded steps from ``pos`` on, less those already stood for. The
   draft is labeled by `match_labels` against it and each valid step is assigned the
   recorded step it stands for by `match_assignment` (a drafted lookup: the first still
   unmatched equal lookup of the window, in the recorded order; a write or reply: the
   window's first non-lookup step). The verdict ``a`` is the verifier's count, clamped to
   the verifiable steps, or with no verifier the oracle's (the leading valid steps).
3. Each of the first ``a`` steps that the oracle labels valid *supplies* the recorded step
   assigned to it. A recorded lookup supplied out of order (beyond a step nothing stands
   for yet) waits as part of the committed context until the walk reaches it.
4. If an approved step is the held write or reply: the recorded steps before it that nothing
   stood for are *skipped* (S never decodes them, no draft supplied them; the recorded
   context still holds them from then on, an approximation), and the walk moves past it.
   Otherwise the walk moves past the supplied steps that are contiguous from ``pos``.
5. If the verdict rejected a drafted step, or the draft was empty (the drafter's window was
   full), S *repairs*: it takes the recorded step the walk stands before (the first one not
   yet supplied), and the walk moves past it and past the supplied steps that follow it.
   A draft accepted whole that held nothing (it ended at the step budget) is not repaired:
   the next round drafts on, as the protocol does.
6. An approved step that the oracle labels invalid is a *false accept*: counted, and the walk
   of that run ends there (the run is no longer GPT-4o's; what follows is *unreached*).

Every recorded assistant step after the first user turn (the cut points of `cut_points`) is
in exactly one of supplied, repaired, skipped, unreached; its tokens are counted by an
injected function (GPT-4o's own tokenizer is not public: the bench uses the drafter's).
Rounds are drafts made; verify passes are the rounds with something to verify.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from specagent.core.metrics import bootstrap_ratio
from specagent.core.types import DraftedStep, Message, Segment, Trajectory
from specagent.runtime.drafting import cut_points
from specagent.runtime.labelers import TextJudge, claim_judge, match_assignment, prefix_closed

# (run, message index of the recorded step the walk stands before, committed context)
DraftRequest = tuple[Trajectory, int, list[Message]]
# every request of one batch -> its drafted segment
DraftMany = Callable[[Sequence[DraftRequest]], Sequence[Segment]]
# (run, committed context, segment) -> accepted prefix of segment.verifiable
Verify = Callable[[Trajectory, list[Message], Segment], int]
CountTokens = Callable[[Message], int]


@dataclass
class RunSavings:
    """One recorded run's walk: where each of S's recorded steps (and its tokens) went."""

    run_id: str
    task_id: str
    steps: int = 0
    tokens: int = 0
    supplied_steps: int = 0
    supplied_tokens: int = 0
    repaired_steps: int = 0
    repaired_tokens: int = 0
    skipped_steps: int = 0
    skipped_tokens: int = 0
    unreached_steps: int = 0
    unreached_tokens: int = 0
    rounds: int = 0
    verify_passes: int = 0
    drafted_steps: int = 0
    accepted_steps: int = 0
    false_accepts: int = 0
    followed_to_end: bool = False
    trace: list[dict[str, Any]] = field(default_factory=list)

    @property
    def supplied_share(self) -> float | None:
        return self.supplied_tokens / self.tokens if self.tokens else None

    def to_json(self, trace: bool = True) -> dict[str, Any]:
        out = asdict(self)
        if not trace:
            out.pop("trace")
        return {**out, "supplied_share": self.supplied_share}


class Walk:
    """The state of one run's walk; `take` plays one round (module docstring)."""

    def __init__(self, run: Trajectory, count_tokens: CountTokens, read_only: dict[str, bool],
                 window: int = 4, judge: TextJudge = claim_judge) -> None:
        self.run, self.read_only, self.window, self.judge = run, read_only, window, judge
        self.cuts = cut_points(run)  # message index of each recorded step
        self.tokens = [count_tokens(run.messages[c]) for c in self.cuts]
        self.pos = 0
        self.fate: dict[int, str] = {}  # recorded step -> supplied | repaired | skipped
        self.ahead: dict[int, DraftedStep] = {}  # supplied beyond pos -> the drafted step standing for it
        self.false_accept = False
        self.result = RunSavings(run.id, run.task_id, steps=len(self.cuts), tokens=sum(self.tokens))
        if self.done:  # a run with no step after the first user turn
            self._finish()

    @property
    def done(self) -> bool:
        return self.false_accept or self.pos >= len(self.cuts)

    @property
    def cut(self) -> int:
        return self.cuts[self.pos]

    def context(self) -> list[Message]:
        """The recorded messages before ``pos``, then the approved lookups waiting ahead."""
        extra = [m for step in self.ahead.values() for m in (step.message, *step.observations)]
        return [*self.run.messages[: self.cut], *extra]

    def reference(self) -> list[int]:
        """The recorded steps from ``pos`` on that nothing stands for yet."""
        return [i for i in range(self.pos, len(self.cuts)) if i not in self.fate]

    def take(self, segment: Segment, accepted: int | None) -> None:
        """One round on ``segment`` (drafted from `context`); ``accepted``: the verifier's
        count, None for the oracle verdict."""
        r, reference, settled = self.result, self.reference(), len(self.fate)
        hits = match_assignment(segment.steps, [self.run.messages[self.cuts[i]] for i in reference],
                                self.read_only, self.window, self.judge)
        labels = prefix_closed([h is not None for h in hits])
        k = len(segment.verifiable)
        oracle = sum(labels[:k])
        a = oracle if accepted is None else max(0, min(int(accepted), k))
        r.rounds += 1
        r.verify_passes += k > 0
        r.drafted_steps += len(segment.steps)
        r.accepted_steps += a
        record: dict[str, Any] = {"cut": self.cut, "drafted": len(segment.steps), "verifiable": k,
                                  "oracle": oracle, "accepted": a, "supplied": [], "skipped": [], "repaired": None}
        held_at = None
        for step, hit in zip(segment.steps[: min(a, oracle)], hits):
            target = reference[hit]
            self._set(target, "supplied", record)
            if step.held:
                held_at = target
            elif target > self.pos:
                self.ahead[target] = step
        if a > oracle:
            self.false_accept = True
            r.false_accepts += 1
            record["false_accept"] = segment.steps[oracle].message.to_openai()
        elif held_at is not None:
            for i in range(self.pos, held_at):
                if i not in self.fate:
                    self._set(i, "skipped", record)
            self._advance()
        else:
            self._advance()
            # the strong model writes the next step after a rejection, an empty draft, or a draft
            # that dropped its next step (a repeated lookup: the runtime repairs there too)
            refused = a < len(segment.steps) or not segment.steps or segment.dropped_step
            if refused and self.pos < len(self.cuts):
                record["repaired"] = self.cuts[self.pos]
                self._set(self.pos, "repaired", record)
                self._advance()
        r.trace.append(record)
        if self.done:
            self._finish()
        elif len(self.fate) == settled:  # every round settles a step; a walk that does not would never end
            raise RuntimeError(f"{self.run.id}: the round at message {self.cut} settled no recorded step")

    def _set(self, i: int, fate: str, record: dict[str, Any]) -> None:
        self.fate[i] = fate
        if fate != "repaired":
            record[fate].append(self.cuts[i])

    def _advance(self) -> None:
        while self.pos < len(self.cuts) and self.pos in self.fate:
            self.ahead.pop(self.pos, None)
            self.pos += 1

    def _finish(self) -> None:
        r = self.result
        for i, n in enumerate(self.tokens):
            fate = self.fate.get(i, "unreached")
            setattr(r, f"{fate}_steps", getattr(r, f"{fate}_steps") + 1)
            setattr(r, f"{fate}_tokens", getattr(r, f"{fate}_tokens") + n)
        r.followed_to_end = not self.false_accept


def simulate(runs: Sequence[Trajectory], draft: DraftMany, verify: Verify | None, count_tokens: CountTokens,
             read_only: Callable[[Trajectory], dict[str, bool]], window: int = 4,
             judge: TextJudge = claim_judge) -> list[RunSavings]:
    """Walk every run to its end or its first false accept, the runs side by side: each
    batch drafts one round of every unfinished run. ``verify`` None: the oracle verdict."""
    walks = [Walk(run, count_tokens, read_only(run), window, judge) for run in runs]
    while active := [w for w in walks if not w.done]:
        requests = [(w.run, w.cut, w.context()) for w in active]
        for walk, (run, _, context), segment in zip(active, requests, draft(requests)):
            accepted = None
            if verify is not None:
                accepted = verify(run, context, segment) if segment.verifiable else 0
            walk.take(segment, accepted)
    return [w.result for w in walks]


SUMMED = ("runs", "steps", "tokens", "supplied_steps", "supplied_tokens", "repaired_steps", "repaired_tokens",
          "skipped_steps", "skipped_tokens", "unreached_steps", "unreached_tokens", "rounds", "verify_passes",
          "drafted_steps", "accepted_steps", "false_accepts", "followed_to_end")


def totals(results: Sequence[RunSavings], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Sums over runs, per-run means, and the supplied token share (a ratio of sums) with a
    95% bootstrap interval over runs (runs resampled with replacement)."""
    sums = {k: sum(int(getattr(r, k)) for r in results) if k != "runs" else len(results) for k in SUMMED}
    n = len(results) or 1
    out: dict[str, Any] = {
        **sums,
        "supplied_share": sums["supplied_tokens"] / sums["tokens"] if sums["tokens"] else None,
        "rounds_per_run": sums["rounds"] / n,
        "verify_passes_per_run": sums["verify_passes"] / n,
        "false_accepts_per_run": sums["false_accepts"] / n,
        "repairs_per_run": sums["repaired_steps"] / n,
    }
    out["supplied_share_ci95"] = bootstrap_share(results, resamples, seed) if results else None
    return out


def bootstrap_share(results: Sequence[RunSavings], resamples: int = 2000, seed: int = 0) -> list[float] | None:
    """The 2.5th and 97.5th percentiles of Σsupplied/Σtokens over resampled sets of runs."""
    return bootstrap_ratio([r.supplied_tokens for r in results], [r.tokens for r in results], resamples, seed)
