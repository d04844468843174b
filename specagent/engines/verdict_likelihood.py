"""A likelihood verdict: the strong model's own probability of each drafted step.

The drafted steps are rendered as the strong model's own turns (the verify prompt of
`core/verify.py` without its review request), and one prefill reads, at every token of
every drafted assistant turn, the strong model's log-probability of that token and
whether it is its most likely one there. A step scores

    1.0                       when every token is the strong model's greedy choice,
    min p(token) otherwise    (over the tokens that are not),

and the verdict is the longest prefix whose steps all score at or above the threshold.
At the default threshold 1.0 a step is accepted only if greedy decoding by the strong
model would have written it token for token: the committed trajectory is the one the
strong model alone would write (up to the engine's numerics), and what the drafter
saves is exactly the decoding of the accepted steps. A threshold below 1 also accepts
steps the strong model finds likely enough without being its first choice; that trades
fidelity for acceptance (a sweep shows the curve). Nothing is decoded and nothing is
trained: any engine that scores prompt positions (transformers; vLLM through
`prompt_logprobs`) serves it, with the strong model's own prompt profile.

This is the token-level acceptance rule of speculative decoding lifted to whole tool-
using steps; a trained verdict head (`verdict_head.py`) is the semantic one, which may
accept a step worded differently from the strong model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from specagent.core.errors import EngineError
from specagent.core.interfaces import ScoreRequest, TokenScorer
from specagent.core.types import DraftedStep, Message, Segment, ToolSpec, Usage, Verdict
from specagent.core.verify import render_steps
from specagent.engines.likelihood_head import LikelihoodHead
from specagent.engines.render import FULL, PromptProfile, render_prompt
from specagent.engines.verdict_head import accepted_prefix, boundary_positions, is_logprob, step_message_indices

GREEDY = 1.0  # the default threshold: only the strong model's greedy steps


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def step_token_spans(tokenizer: Any, messages: Sequence[Message], tools: Sequence[ToolSpec],
                     step_indices: Sequence[int], boundary: str = "<|im_end|>",
                     profile: PromptProfile = FULL) -> tuple[list[int], list[tuple[int, int]]]:
    """(token ids of `messages`, per step the [first, last] token positions of its assistant
    turn: from the first token after the assistant header to the boundary that closes it, the
    position a verdict head reads: `boundary_positions`)."""
    ids, lasts = boundary_positions(tokenizer, messages, tools, step_indices, boundary, profile)
    spans = []
    for index, last in zip(step_indices, lasts):
        header = _ids(tokenizer, render_prompt(tokenizer, messages[:index], tools, profile=profile))
        first = next((i for i, (a, b) in enumerate(zip(header, ids)) if a != b), len(header))  # tokens may merge
        spans.append((max(first, 1), last))
    return ids, spans


def step_entries(entries: Sequence[Sequence[float]], spans: Sequence[tuple[int, int]]) -> list[Sequence[Sequence[float]]]:
    """The scored positions, split per step."""
    out, i = [], 0
    for first, last in spans:
        out.append(entries[i: i + last - first + 1])
        i += last - first + 1
    return out


def checked_entries(entries: Any, positions: int) -> list[tuple[float, bool]]:
    """An engine's own-token entries as (log-probability, is the greedy choice) pairs, after
    checking they are what a scorer reports: exactly one per scored position, each a real
    log-probability (<= 0, or -inf) and a flag that is 0 or 1. Anything else raises: the
    runtime counts it as an invalid verdict and rejects every drafted step; a truncated or
    garbled report must not read as "no off-greedy token" and approve a held write."""
    if not isinstance(entries, Sequence) or len(entries) != positions:
        got = len(entries) if isinstance(entries, Sequence) else type(entries).__name__
        raise EngineError(f"likelihood verdict: the engine scored {got} positions, {positions} were asked")
    out = []
    for entry in entries:
        if not isinstance(entry, Sequence) or isinstance(entry, (str, bytes)) or len(entry) != 2:
            raise EngineError(f"likelihood verdict: a scored position is {entry!r}, not [logprob, is_top]")
        logprob, top = entry
        if not is_logprob(logprob):
            raise EngineError(f"likelihood verdict: {logprob!r} is not a log-probability")
        if isinstance(top, bool):
            top = float(top)
        if not isinstance(top, (int, float)) or top not in (0.0, 1.0):
            raise EngineError(f"likelihood verdict: is_top {top!r} is neither 0 nor 1")
        out.append((float(logprob), bool(top)))
    return out


def greedy_score(own: Sequence[Sequence[float]]) -> float:
    """One step's score: 1.0 if every token is the top one, else the least probability among those that are not."""
    off = [math.exp(logprob) for logprob, is_top in own if not is_top]
    return min(off) if off else 1.0


def step_scores(entries: Sequence[Sequence[float]], spans: Sequence[tuple[int, int]]) -> list[float]:
    """`greedy_score` of every step."""
    return [greedy_score(own) for own in step_entries(entries, spans)]


def likelihood_request(engine: TokenScorer, messages: Sequence[Message], tools: Sequence[ToolSpec],
                       step_indices: Sequence[int], adapter: str | None = None
                       ) -> tuple[ScoreRequest, list[tuple[int, int]]]:
    """The one prefill the likelihood verdict makes over drafted steps (each an assistant message
    at ``step_indices`` of ``messages``, the context then the rendered steps), and each step's
    span; `step_entries` of its scores over those spans are what a likelihood head is trained on."""
    ids, spans = step_token_spans(engine.tokenizer, messages, tools, step_indices,
                                  profile=engine.profile_for(adapter))
    positions = [t - 1 for first, last in spans for t in range(first, last + 1)]  # read before each token
    return ScoreRequest(ids, positions, adapter=adapter, own=True), spans


def greedy_run(own: Sequence[Sequence[float]]) -> int:
    """How many of a step's tokens, from its first, are the strong model's greedy choices."""
    return next((n for n, (_, is_top) in enumerate(own) if not is_top), len(own))


def opening_text(tokenizer: Any, prompt: str, header: str, end_token: int) -> str:
    """The text of a step in `prompt` from its start (the end of `header`, the prompt of the
    context before it) up to the end of token `end_token`; "" when the two do not line up
    (a token that spans the header's end)."""
    if end_token < 0 or not prompt.startswith(header):
        return ""
    offsets = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if end_token >= len(offsets):
        return ""
    end = offsets[end_token][1]
    starts = {start for start, _ in offsets}
    return prompt[len(header):end] if end > len(header) and len(header) in starts else ""


@dataclass(frozen=True)
class _Prefill:
    """What one verify prefill read: per step its score, span and scored positions; the
    unfinished step's first position and scored positions; the prompt text with it and before it."""

    scores: list[float]
    usage: Usage
    spans: list[tuple[int, int]]
    per_step: list[Sequence[Sequence[float]]]
    unfinished_first: int
    unfinished: Sequence[Sequence[float]]
    text: str
    head: str


class LikelihoodVerifier:
    """Verdicts from the strong model's own token probabilities: one prefill, zero decoded tokens."""

    def __init__(self, engine: TokenScorer, threshold: float | None = None, adapter: str | None = None,
                 continue_repairs: bool = True, head: LikelihoodHead | None = None) -> None:
        """``continue_repairs``: the verdict names the first rejected step's opening that the
        strong model ranks first token by token (`Verdict.repair_from`), so the repair decodes
        only from where the draft left the strong model's greedy path; only valid when the
        repair runs on the weights that scored (the engine's base weights: ``adapter`` None), on
        an engine that continues a message (`continues_messages`; not the openai backend).
        ``head``: a trained likelihood head scores each step from the same scored positions
        (`likelihood_head.py`); the threshold is then its calibrated one unless given."""
        self.engine = engine
        self.head = head
        self.threshold = threshold if threshold is not None else head.threshold if head is not None else GREEDY
        self.adapter = adapter
        self.continue_repairs = (continue_repairs and adapter is None
                                 and getattr(engine, "continues_messages", False))
        # a segment's unfinished step (`Segment.partial`) is scored too: only worth it when its
        # opening can be continued
        self.reads_partial = self.continue_repairs

    def prompt(self, context: Sequence[Message], tools: Sequence[ToolSpec],
               steps: Sequence[DraftedStep]) -> tuple[list[int], list[tuple[int, int]]]:
        """The verify prompt's token ids and, per step, the [first, last] positions it scores."""
        request, spans = likelihood_request(self.engine, [*context, *render_steps(steps)], tools,
                                            step_message_indices(len(context), steps), self.adapter)
        return list(request.token_ids), spans

    def scores(self, context: Sequence[Message], tools: Sequence[ToolSpec],
               steps: Sequence[DraftedStep]) -> tuple[list[float], Usage]:
        scored = self._score(context, tools, steps)
        return scored.scores, scored.usage

    def _score(self, context: Sequence[Message], tools: Sequence[ToolSpec], steps: Sequence[DraftedStep],
               partial: str = "") -> "_Prefill":
        """One prefill over the drafted steps and, after the next assistant header, the unfinished
        step ``partial`` (scored only if its text leaves the steps' tokens as they are)."""
        ids, spans = self.prompt(context, tools, steps)
        head, text, tail = "", "", (0, -1)
        if partial:
            head = render_prompt(self.engine.tokenizer, [*context, *render_steps(steps)], tools,
                                 profile=self.engine.profile_for(self.adapter))
            text = head + partial
            with_partial = _ids(self.engine.tokenizer, text)
            first = next((i for i, (a, b) in enumerate(zip(ids, with_partial)) if a != b), len(ids))
            if not spans or first > spans[-1][1]:
                ids, tail = with_partial, (first, len(with_partial) - 1)
        positions = [t - 1 for first, last in [*spans, tail] for t in range(first, last + 1)]  # read before each token
        scored = self.engine.score([ScoreRequest(ids, positions, adapter=self.adapter, own=True)])[0]
        entries = checked_entries(scored.logprobs, len(positions))
        *per_step, unfinished = step_entries(entries, [*spans, tail])
        scores = ([self.head.score(own) for own in per_step] if self.head is not None
                  else step_scores(entries, spans))
        return _Prefill(scores, scored.usage, spans, per_step, tail[0], unfinished,
                        text, head)

    def verify(self, context: Sequence[Message], tools: Sequence[ToolSpec], segment: Segment
               ) -> tuple[Verdict, list[tuple[str, Usage]]]:
        steps = segment.verifiable
        whole = len(steps) == len(segment.steps)  # no malformed step between them and the unfinished one
        partial = segment.partial if self.reads_partial and segment.partial and whole else ""
        if not steps and not partial:
            return Verdict(accepted=0, raw="(nothing to verify)"), []
        scored = self._score(context, tools, steps, partial)
        accepted = accepted_prefix(scored.scores, self.threshold)
        raw = ("likelihood head " if self.head is not None else "likelihood ") + " ".join(f"{s:.3f}" for s in scored.scores)
        opening = ""
        if self.continue_repairs and accepted < len(steps):
            # at most up to the closing token: a step rejected though S would write all of it (a
            # head's verdict) is repaired by S decoding its end, not by S going on past it into
            # a second call of the same turn (a cancel sent twice)
            run = min(greedy_run(scored.per_step[accepted]), len(scored.per_step[accepted]) - 1)
            end = scored.spans[accepted][0] + run - 1
            opening = self.opening(context, tools, steps, accepted, end) if run else ""
        elif partial:  # every step accepted: the repair is the unfinished one
            run = greedy_run(scored.unfinished)
            raw += f" | unfinished {run}/{len(scored.unfinished)}"
            end = scored.unfinished_first + run - 1
            opening = opening_text(self.engine.tokenizer, scored.text, scored.head, end) if run else ""
        verdict = Verdict(accepted=accepted, raw=raw, scores=tuple(scored.scores), repair_from=opening)
        return verdict, [("strong", scored.usage)]

    def opening(self, context: Sequence[Message], tools: Sequence[ToolSpec], steps: Sequence[DraftedStep],
                index: int, end_token: int) -> str:
        """The text of drafted step `index` up to the verify prompt's token `end_token`."""
        messages = [*context, *render_steps(steps)]
        where = step_message_indices(len(context), steps)[index]
        profile = self.engine.profile_for(self.adapter)
        tokenizer = self.engine.tokenizer
        prompt = render_prompt(tokenizer, messages, tools, profile=profile)
        header = render_prompt(tokenizer, messages[:where], tools, profile=profile)
        return opening_text(tokenizer, prompt, header, end_token)
