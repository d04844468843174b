"""Per-step validity labels for drafted segments (DESIGN §2). Labels are prefix-closed.

- `match`: a drafted step is valid if it is equivalent to what the strong trajectory
  does next within a window; read-only lookups may come in another order; replies are
  compared by a pluggable text judge.
- `judge`: the strong model grades the drafted steps with the strong continuation as
  reference and returns the first invalid index.

The default reply judge of `match` is `claim_judge` (facts and claim must agree);
`overlap_judge` (facts and word overlap only) is kept for comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from specagent.core.canonical import normalise_text, same_step
from specagent.core.classify import failed_call
from specagent.core.interfaces import ChatEngine, ChatRequest
from specagent.core.types import DraftedStep, Message, StepKind, ToolSpec, Usage
from specagent.core.verify import parse_verdict, verify_messages

TextJudge = Callable[[str, str], bool]

_KEY_TOKEN = re.compile(r"[a-z]*\d[\w.\-]*")


def overlap_judge(draft: str, reference: str, min_f1: float = 0.5) -> bool:
    """The former default text judge: every id/number the reference states is stated by
    the draft, and the word overlap (F1) is at least ``min_f1``. It accepts a reply that
    repeats the reference's facts with the opposite claim ("can be updated, please confirm"
    for "has been updated"); `claim_judge` replaced it as the default (issue 15)."""
    d, r = normalise_text(draft), normalise_text(reference)
    if not set(_KEY_TOKEN.findall(r)) <= set(_KEY_TOKEN.findall(d)):
        return False
    dw, rw = d.split(), r.split()
    if not dw or not rw:
        return dw == rw
    common = len(set(dw) & set(rw))
    precision, recall = common / len(set(dw)), common / len(set(rw))
    return precision + recall > 0 and 2 * precision * recall / (precision + recall) >= min_f1


# --- claim_judge -------------------------------------------------------------------------

DONE, CANNOT, ASKS, INFORMS, PARTIAL = "done", "cannot", "asks", "informs", "partial"

# past participles (and simple pasts) of state-changing actions: "has been <verb>", "I <verb>"
_ACTION = (r"(?:cancell?ed|booked|rebooked|reserved|updated|changed|modified|upgraded|downgraded|added|"
           r"removed|processed|refunded|credited|charged|issued|sent|applied|completed|confirmed|"
           r"transferred|made|switched|submitted|placed|finali[sz]ed|waived|covered|adjusted|done)")
_NEG = r"(?:not|n't|never)"
# "has been cancelled", "have not been added", "was successfully processed", "were not refunded"
_PASSIVE = re.compile(rf"\b(?:has|have|had|was|were)(?:n't)?\s+(?:(?P<n1>{_NEG})\s+)?"
                      rf"(?:(?:been|already|successfully|now|also|just|fully)\s+){{0,3}}{_ACTION}\b")
# "I've updated", "we have not cancelled", "I cancelled", "I successfully booked"
_ACTIVE = re.compile(rf"\b(?:i|we)(?:'ve|\s+have|\s+had)?(?:n't)?\s+(?:(?P<n1>{_NEG})\s+)?"
                     rf"(?:(?:already|successfully|now|also|just)\s+){{0,2}}{_ACTION}\b")
_SUCCESS = re.compile(rf"(?<!un)\bsuccessfully\b|\b(?:is|are) now (?:\w+ ){{0,2}}{_ACTION}\b|"
                      r"\b(?:is|are) (?:now )?(?:confirmed|complete|all set)\b")
_CANNOT = re.compile(r"\b(?:cannot|can ?not|can't|could ?not|couldn't|unable|not able|won't be able|will not be able|"
                     r"not possible|impossible|not eligible|ineligible|isn't eligible|not allowed|not permitted|"
                     r"(?:does|do|did)(?: not|n't) allow|refuse|must decline|have to decline)\b")
# "cannot proceed without the reservation id" asks for it
_NEEDS = re.compile(r"\s*(?:to\s+)?(?:proceed|continue|go ahead|assist|help|access|look up|find|locate|"
                    r"do (?:this|that|so))\b[^.?!]*?\bwithout (?:your|the|a|an)\b")
_ASKS = re.compile(r"\b(?:please (?:provide|give|confirm|let me know|share|specify|choose|select|tell|send|reply|"
                   r"respond|advise|check|clarify|indicate)|could you|can you|would you (?:like|prefer)|"
                   r"shall i|should i|do you (?:want|wish|prefer)|let me know (?:which|what|if|whether|how)|"
                   r"(?:i'll|i will|i would|i)\s+need (?:your|the|to know|you to|to confirm|some|a few|more)|"
                   r"confirm (?:if|whether|that|with|the|your|a few))\b")
# a cue inside a clause opened by one of these states a condition or a reason, not the claim
_BACKGROUND = re.compile(r"\b(?:if|unless|once|when|whether|since|because|after|before|until)\b")
_RELATIVE = re.compile(r"\b(?:that|which|who)\s+$")  # "flights that were cancelled"
_CLOSING = re.compile(r"(?:any (?:other|more|further) (?:questions?|assistance|help)|further assistance|"
                      r"anything else|feel free|don't hesitate|do not hesitate|safe travels|"
                      r"have a (?:great|good|nice|wonderful|safe)|you're welcome|happy to help)")
_OFFER = re.compile(r"\b(?:would you like|shall i|do you want|please (?:confirm|provide)|could you)\b")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_CLAUSE_START = re.compile(r"[,;:()\u2014]|\s-\s|\b(?:and|but|so|while)\b")


def _sentences(text: str) -> list[str]:
    text = re.sub(r"[*`_#>]+", " ", (text or "").lower()).replace("\u2019", "'")
    return [s.strip() for s in _SENTENCE.split(text) if s and s.strip()]


def _live(sentence: str, match: re.Match[str]) -> bool:
    """A cue counts unless its clause (back to the last comma, colon, 'and', 'but', ...) opens
    with a condition or a reason ('if it was booked', 'unless ... was purchased', 'since it
    has been cancelled') or it opens a relative clause ('flights that were cancelled')."""
    head = sentence[: match.start()]
    starts = [m.end() for m in _CLAUSE_START.finditer(head)]
    clause = head[starts[-1] if starts else 0:]
    return not _BACKGROUND.search(clause) and not _RELATIVE.search(clause)


def reply_claim(text: str) -> str:
    """What a reply asserts about the action; see `claim_judge` for the rules."""
    done = cannot = asks = False
    for sentence in _sentences(text):
        question = sentence.endswith("?")
        if _CLOSING.search(sentence) and not _OFFER.search(sentence):
            continue  # "If you need any further assistance, feel free to ask!"
        for rx in (_PASSIVE, _ACTIVE):
            for m in rx.finditer(sentence):
                if not _live(sentence, m) or question:
                    continue
                if m.group("n1") or "n't" in m.group(0):
                    cannot = True  # "has not been cancelled": not done
                else:
                    done = True
        if not question and any(_live(sentence, m) for m in _SUCCESS.finditer(sentence)):
            done = True
        for m in _CANNOT.finditer(sentence):
            if _live(sentence, m):
                if _NEEDS.match(sentence, m.end()):
                    asks = True
                else:
                    cannot = True
        if question or _ASKS.search(sentence):
            asks = True
    if done and cannot:
        return PARTIAL
    return DONE if done else CANNOT if cannot else ASKS if asks else INFORMS


_MONTHS = {m: i for i, m in enumerate(("january", "february", "march", "april", "may", "june", "july",
                                       "august", "september", "october", "november", "december"), 1)}
_ISO_DATE = re.compile(r"\b\d{4}-(\d{1,2})-(\d{1,2})\b")
_NAMED_DATE = re.compile(r"\b(" + "|".join(_MONTHS) + r")\s+(\d{1,2})(?:st|nd|rd|th)?\b(?:,?\s+\d{4}\b)?")
_FACT = re.compile(r"[a-z_]*\d[a-z0-9_]*(?::\d+)?")


def _canonical_facts_text(text: str) -> str:
    t = re.sub(r"(?m)^\s*(?:\d+[.)]|[-*\u2022])\s+", " ", (text or "").lower())  # list markers
    t = re.sub(r"\s+", " ", t)
    t = _ISO_DATE.sub(lambda m: f"date{int(m[1]):02d}{int(m[2]):02d}", t)
    t = _NAMED_DATE.sub(lambda m: f"date{_MONTHS[m[1]]:02d}{int(m[2]):02d}", t)
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)  # 2,544 -> 2544
    t = re.sub(r"(?<=\d)\.00?\b", "", t)  # $150.00 -> 150
    return re.sub(r"\b0(\d:\d\d)\b", r"\1", t)  # 07:00 -> 7:00


def reply_facts(text: str) -> set[str]:
    """The ids, numbers, dates and times a reply states, in one spelling each."""
    return set(_FACT.findall(_canonical_facts_text(text)))


def _word_f1(draft: str, reference: str) -> float:
    dw = set(re.findall(r"[a-z0-9_]+", _canonical_facts_text(draft)))
    rw = set(re.findall(r"[a-z0-9_]+", _canonical_facts_text(reference)))
    if not dw or not rw:
        return float(dw == rw)
    common = len(dw & rw)
    return 0.0 if not common else 2 * common / (len(dw) + len(rw))


def claim_judge(draft: str, reference: str, min_f1: float = 0.5) -> bool:
    """The cheap default text judge: a drafted reply is valid iff it makes the same claim as
    the reference, states every fact the reference states, and overlaps it in words.

    Facts: the ids, numbers, dates and times of the reference (`reply_facts`: dates in one
    spelling, ``2024-05-20`` = ``May 20th``; ``$2,544`` = ``2544``; list numbering ignored)
    must all be in the draft, and word-set F1 must be at least ``min_f1``.

    Claim (`reply_claim`), from cues in the sentences of the reply, lower-cased, markdown
    stripped:

    - closings are skipped: a sentence with "any further assistance", "anything else",
      "feel free", "safe travels", ... that asks nothing ("would you like", "please
      confirm", ...).
    - done: "has/have/had/was/were [not] [been|already|successfully|now] <action>",
      "I/we ['ve|have] <action>", "successfully", "is/are now ... <action>", where
      <action> is a state-changing participle (cancelled, booked, updated, changed, added,
      processed, refunded, charged, issued, upgraded, completed, ...; not found, created,
      delayed, delivered); "is/are [now] confirmed/complete/all set".
    - cannot (not done / refused): "cannot", "can't", "could not", "unable", "not able",
      "not possible", "not eligible", "not allowed", "does not allow", "refuse", "must
      decline"; and a done cue negated inside it: "has not been cancelled", "I haven't
      updated", "were never refunded".
    - asks (needs input): a sentence ending in "?", "please provide/give/confirm/let me
      know/specify/...", "could you", "can you", "would you like", "shall I", "do you want",
      "let me know which/what/if", "I('ll) need your/the/to know", "confirm if/whether/the";
      and a cannot cue followed by "proceed/continue/assist/help/access/find ... without
      your/the ..." ("cannot proceed without the reservation id" asks for it).
    - informs: none of these.

    Context: a done or cannot cue does not count when its clause (back to the last comma,
    colon, semicolon, bracket, dash, "and", "but", "so", "while") contains a condition or
    reason word: "if", "unless", "once", "when", "whether", "since", "because", "after",
    "before", "until" ("I can only cancel it if it was booked ...", "if you are unable to
    find it"), or when it follows "that/which/who" ("flights that were cancelled"); a done
    cue in a question does not count ("was it booked in the last 24 hours?").

    Precedence: done and cannot together are `partial` (part done, part refused); else done
    > cannot > asks > informs, so "X has been cancelled. Would you like to book a new
    flight?" is done and "I cannot change basic economy. Would you like a human agent?" is
    cannot. Claims must be equal; `partial` equals only `partial`. A draft equal to the
    reference up to case and whitespace is valid.
    """
    if normalise_text(draft) == normalise_text(reference):
        return True
    if reply_claim(draft) != reply_claim(reference):
        return False
    if not reply_facts(reference) <= reply_facts(draft):
        return False
    return _word_f1(draft, reference) >= min_f1


def prefix_closed(valid: Sequence[bool]) -> list[int]:
    """1 up to the first invalid step, 0 from there on."""
    out, ok = [], True
    for v in valid:
        ok = ok and bool(v)
        out.append(int(ok))
    return out


def reference_steps(messages: Sequence[Message], cut: int) -> list[Message]:
    """The strong trajectory's assistant steps from message ``cut`` on."""
    return [m for m in messages[cut:] if m.role == "assistant"]


def match_labels(
    steps: Sequence[DraftedStep],
    reference: Sequence[Message],
    read_only: dict[str, bool],
    window: int = 4,
    judge: TextJudge = claim_judge,
) -> list[int]:
    """Label drafted steps against the strong continuation.

    The window is the next ``window`` strong steps, cut after the first one that is not
    a pure lookup. A drafted lookup is valid if it equals any unmatched lookup of the
    window (order may differ); a drafted write or reply is valid if it matches the
    window's first non-lookup step (a reply through ``judge``, by default `claim_judge`).
    """
    return prefix_closed([hit is not None for hit in match_assignment(steps, reference, read_only, window, judge)])


def match_assignment(
    steps: Sequence[DraftedStep],
    reference: Sequence[Message],
    read_only: dict[str, bool],
    window: int = 4,
    judge: TextJudge = claim_judge,
) -> list[int | None]:
    """The strong step each drafted step stands for under `match_labels`' rules: its index in
    ``reference``, or None where the step is not valid (before prefix closing). A drafted
    lookup takes the first still unmatched equal lookup of the window, in the window's order."""
    window_steps = []
    for ref in reference[:window]:
        window_steps.append(ref)
        if not _is_lookup(ref, read_only):
            break
    lookups = [i for i, r in enumerate(window_steps) if _is_lookup(r, read_only)]
    action = next((i for i, r in enumerate(window_steps) if not _is_lookup(r, read_only)), None)
    hits: list[int | None] = []
    for step in steps:
        if step.kind is StepKind.MALFORMED:
            hits.append(None)
        elif step.kind is StepKind.READ:
            hit = next((i for i in lookups if same_step(step.message, window_steps[i])), None)
            if hit is not None:
                lookups.remove(hit)
            hits.append(hit)
        elif action is None:
            hits.append(None)
        elif step.kind is StepKind.REPLY:
            ref = window_steps[action]
            ok = not ref.tool_calls and judge(step.message.content or "", ref.content or "")
            hits.append(action if ok else None)
        else:
            hits.append(action if same_step(step.message, window_steps[action]) else None)
    return hits


def _is_lookup(message: Message, read_only: dict[str, bool]) -> bool:
    return bool(message.tool_calls) and all(read_only.get(c.name, False) for c in message.tool_calls)


def judge_request(context: Sequence[Message], steps: Sequence[DraftedStep], reference: Sequence[Message]) -> list[Message]:
    """The verify prompt with the strong continuation shown as the reference answer."""
    messages = verify_messages(context, steps)
    shown = "\n".join(_describe(m) for m in reference[:4]) or "(the reference agent ended here)"
    question = messages[-1].content
    note = f"For reference, a strong agent's next steps here were:\n{shown}\nEquivalent steps (other order of lookups, other wording) are valid.\n"
    return [*messages[:-1], Message(role="user", content=note + question)]


def _describe(message: Message) -> str:
    if message.tool_calls:
        return "; ".join(f"call {c.name}({c.arguments})" for c in message.tool_calls)
    return f"reply: {message.content}"


def judge_labels(
    engine: ChatEngine,
    jobs: Sequence[tuple[Sequence[Message], Sequence[DraftedStep], Sequence[Message]]],
    tools: Sequence[ToolSpec],
    max_tokens: int = 8,
) -> list[tuple[list[int], Usage, str]]:
    """`judge` labels for many segments in one batched call: (labels, usage, raw reply)."""
    verifiable = [[s for s in steps if s.kind is not StepKind.MALFORMED] for _, steps, _ in jobs]
    requests = [
        ChatRequest(judge_request(ctx, ok, ref), tools, max_tokens)
        for (ctx, _, ref), ok in zip(jobs, verifiable)
    ]
    out = []
    for (_, steps, _), ok, completion in zip(jobs, verifiable, engine.chat(requests)):
        accepted = parse_verdict(completion.text, len(ok)) or 0
        labels = [int(i < accepted) for i in range(len(steps))]
        out.append((prefix_closed(labels), completion.usage, completion.text))
    return out


@dataclass(frozen=True)
class RolloutJob:
    """One drafted segment to label by rollouts: a live environment restored to its cut point
    (a fresh one per call), the task, the context before the cut and the drafted steps."""

    restore_env: Callable[[], Any]
    task_id: str
    context: Sequence[Message]
    steps: Sequence[DraftedStep]


def rollout_outcome(job: RolloutJob, prefix: int, strong: ChatEngine, max_steps: int = 8,
                    max_tokens: int = 256) -> tuple[float, int, bool]:
    """(reward, agent steps, failed) of one rollout: a live environment restored to the cut point
    takes the first ``prefix`` drafted steps (a held write executed as if approved, a held reply
    answered by the user), then the strong model continues for up to ``max_steps`` steps. The
    agent steps are the episode's assistant turns, the context's included; ``failed``: a call of
    the prefix's last step failed (its observation, `failed_call`)."""
    from specagent.core.protocol import Models, ProtocolConfig, run_episode

    def steps(messages: Sequence[Message]) -> int:
        return sum(m.role == "assistant" for m in messages)

    env = job.restore_env()
    messages, failed = list(job.context), False
    for step in job.steps[:prefix]:
        messages.append(step.message)
        results = list(step.observations)
        if not results:
            for call in step.message.tool_calls:  # the held write, executed as approved
                results.append(Message(role="tool", content=env.execute(call), tool_call_id=call.id, name=call.name))
        messages.extend(results)
        failed = any(failed_call(r.content) for r in results)
        if not step.message.tool_calls:  # a held reply: the user answers or the conversation ends
            answer = env.user_turn(step.message.content or "")
            if answer is None:
                return env.reward(messages).reward, steps(messages), failed
            messages.append(Message(role="user", content=answer))
    budget = ProtocolConfig(max_steps=steps(messages) + max_steps, max_tokens=max_tokens)
    episode = run_episode(env, job.task_id, "strong", Models(strong=strong), budget, start_from=messages)
    return episode.reward, steps(episode.messages), failed


def rollout_labels_many(jobs: Sequence[RolloutJob], strong: ChatEngine, max_steps: int = 8, max_tokens: int = 256,
                        concurrency: int = 1, on_done: Callable[[], None] | None = None, min_reward: float = 1.0,
                        max_extra_steps: int | None = None, failed_calls_invalid: bool = False,
                        ) -> list[tuple[list[int], list[float | None]]]:
    """`rollout` labels of many segments: (labels, rewards with the baseline first) per job.

    A job's rollouts are the baseline (the strong model alone from the cut point) and one per
    drafted prefix. Drafted step j is valid when the rollout after prefix 1..j scores at least
    the baseline **and** at least ``min_reward`` (1.0: the task solved). Without the second
    condition every step of a segment where the strong model fails from the cut point anyway
    (baseline 0) would be valid, a wrong write among them. With ``max_extra_steps`` k, the
    rollout must also end within k agent steps of the baseline's: a draft the strong model
    recovers from (the same lookup twice, a needless one) still solves the task, but costs a
    step and a round the strong model's own next step would not. With ``failed_calls_invalid``,
    a step whose call failed (`failed_call`: a lookup with a wrong email, a refused write) is
    invalid whatever follows: the strong model may go on without the lookup at no step's cost,
    the store's reward not checking that the user was identified. They run in waves: the
    baselines and first prefixes of every job, then prefix j of each job whose prefix j-1 was
    valid. Labels are prefix-closed, so a prefix after a failed one is not rolled out (its
    reward is None, its label 0). ``concurrency``
    N > 1 runs N rollouts of a wave side by side, one per thread, their requests answered together
    in batched calls of ``strong`` (`BatchingEngine`), as `run_tasks` runs episodes: the labels
    are those of one-at-a-time rollouts up to the engine's batch-dependent numerics. ``on_done``
    is called once per rollout, run or skipped."""
    outcomes: dict[tuple[int, int], tuple[float, int, bool]] = {}  # (reward, agent steps, failed)
    engine, group = strong, None
    if concurrency > 1:
        from specagent.engines.batching import BatchingEngine, CallerGroup

        group = CallerGroup()
        engine = BatchingEngine(strong, group, max_batch=max(64, concurrency))

    def run(unit: tuple[int, int]) -> None:
        if group is None:
            outcomes[unit] = rollout_outcome(jobs[unit[0]], unit[1], engine, max_steps, max_tokens)
        else:
            with group.member():
                outcomes[unit] = rollout_outcome(jobs[unit[0]], unit[1], engine, max_steps, max_tokens)
        if on_done:
            on_done()

    def valid(n: int, j: int) -> bool:  # drafted step j (1-based): as well as the baseline, and a solve
        (reward, steps, failed), (baseline, baseline_steps, _) = outcomes[n, j], outcomes[n, 0]
        return (jobs[n].steps[j - 1].kind is not StepKind.MALFORMED and reward >= max(baseline, min_reward)
                and (max_extra_steps is None or steps <= baseline_steps + max_extra_steps)
                and not (failed_calls_invalid and failed))

    wave = [(n, j) for n, job in enumerate(jobs) for j in range(min(len(job.steps), 1) + 1)]
    while wave:
        if group is None:
            for unit in wave:
                run(unit)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(concurrency, thread_name_prefix="rollout") as pool:
                for future in [pool.submit(run, unit) for unit in wave]:
                    future.result()  # the first error, raised here
        ran, wave = wave, []
        for n, j in ran:
            if j == 0 or j == len(jobs[n].steps):
                continue
            if valid(n, j):
                wave.append((n, j + 1))
            elif on_done:
                for _ in range(len(jobs[n].steps) - j):  # not rolled out: labeled 0
                    on_done()
    out = []
    for n, job in enumerate(jobs):
        labels = prefix_closed([(n, j) in outcomes and valid(n, j) for j in range(1, len(job.steps) + 1)])
        out.append((labels, [outcomes[n, j][0] if (n, j) in outcomes else None for j in range(len(job.steps) + 1)]))
    return out


def rollout_labels(
    restore_env: Callable[[], Any],
    task_id: str,
    context: Sequence[Message],
    steps: Sequence[DraftedStep],
    strong: ChatEngine,
    max_steps: int = 8,
    max_tokens: int = 256,
    min_reward: float = 1.0,
    max_extra_steps: int | None = None,
    failed_calls_invalid: bool = False,
) -> tuple[list[int], list[float]]:
    """`rollout` labels (Monte-Carlo) of one segment: for each drafted prefix d1..dj, a live
    environment restored to the cut point takes the prefix (`rollout_outcome`), the strong model
    continues, and the environment scores the episode. Step j is valid if that reward is at
    least the reward of the strong model continuing from the cut point alone and at least
    ``min_reward`` (and, with ``max_extra_steps`` k, ends within k agent steps of it; with
    ``failed_calls_invalid``, no call of step j failed). Returns (labels, rewards with the
    baseline first). Many segments at once: `rollout_labels_many`."""
    return rollout_labels_many([RolloutJob(restore_env, task_id, context, steps)], strong, max_steps, max_tokens,
                               min_reward=min_reward, max_extra_steps=max_extra_steps,
                               failed_calls_invalid=failed_calls_invalid)[0]
