"""The SpecAgent round (DESIGN §1) and the baselines, on one episode.

    DRAFT   the weak model writes steps; read-only ones are executed as drafted,
            the first state-changing step is held, a malformed step ends the draft.
    VERIFY  the strong model judges the segment in one prefill: a = valid prefix length.
    COMMIT  the first a steps join the context; an approved held step is executed;
            otherwise the strong model repairs step a+1 and that step is executed.

The baselines `strong`, `weak` and `stepwise` run through the same step execution and
accounting, so their numbers compare with SpecAgent's one for one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Sequence

from specagent.core.accounting import Ledger
from specagent.core.canonical import same_step
from specagent.core.classify import classify_tools, drafted, terminal_tools
from specagent.core.draft import DraftJob, assign_call_ids, draft_batch
from specagent.core.errors import ContextLengthExceeded
from specagent.core.execution import ToolRunner
from specagent.core.interfaces import ChatEngine, ChatRequest, Completion, Environment, Verifier
from specagent.core.types import DraftedStep, Message, Segment, StepKind, StepStatus, ToolCall, ToolSpec, Usage
from specagent.core.verify import granted_prefix

Mode = Literal["strong", "weak", "stepwise", "specagent"]
NOT_RUN = "Error: not executed (the episode stopped before this call)"
MODES: tuple[str, ...] = ("strong", "weak", "stepwise", "specagent")


@dataclass(frozen=True)
class ProtocolConfig:
    max_draft_steps: int = 4
    max_steps: int = 24  # committed assistant steps per episode
    max_tokens: int = 256  # per generated step
    # the drafter stops a step at its first token less likely than this (0: never); the unfinished
    # step is verified with the rest and the repair goes on from the part S would write
    draft_stop_below: float = 0.0
    # the drafter's read-only step that repeats a call made since the last user turn or write ends
    # the draft without it (its results are in the context already)
    draft_stop_repeats: bool = False
    tool_timeout_s: float = 30.0
    read_only: tuple[str, ...] = ()  # user allow list: these tools are read-only
    write: tuple[str, ...] = ()  # user deny list: these tools are state-changing


@dataclass(frozen=True)
class Models:
    """Who plays which role. ``verifier`` is needed only by `specagent`."""

    strong: ChatEngine | None = None
    weak: ChatEngine | None = None
    verifier: Verifier | None = None
    strong_adapter: str | None = None  # repair / act adapter on the strong engine (usually None)
    weak_adapter: str | None = None  # the drafter adapter on the weak engine


@dataclass(frozen=True)
class StepRecord:
    """One assistant step in the transcript: who wrote it and what became of it."""

    round: int
    source: Literal["weak", "strong"]
    kind: StepKind
    status: StepStatus
    tools: tuple[str, ...]
    text: str
    malformed: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "source": self.source,
            "kind": self.kind.value,
            "status": self.status.value,
            "tools": list(self.tools),
            "text": self.text,
            "malformed": self.malformed,
        }


@dataclass
class Episode:
    """The outcome of one episode: final conversation, transcript, metrics and ledger."""

    task_id: str
    mode: str
    messages: list[Message] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    accepted_prefixes: list[int] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)  # the verifier's raw reply, per round
    ledger: Ledger = field(default_factory=Ledger)
    write_calls: list[str] = field(default_factory=list)
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    stop_reason: str = ""
    wall_seconds: float = 0.0
    env_seconds: float = 0.0
    final_hash: str = ""
    invalid_verdicts: int = 0  # rounds whose verdict was unparseable, out of range, not an int, or raised
    continued_repairs: int = 0  # repairs that went on from the rejected step's opening S itself ranks first
    unsure_drafts: int = 0  # drafts that ended at a step the drafter was unsure how to go on with
    unknown_effects: list[str] = field(default_factory=list)  # write calls that timed out while running
    tools_still_running: list[str] = field(default_factory=list)  # at the end: the env must not be reused

    def counts(self) -> dict[str, Any]:
        """The per-episode metrics of DESIGN §3."""
        drafted = [s for s in self.steps if s.source == "weak" and s.status is not StepStatus.AUTHORED]
        accepted = [s for s in drafted if s.status in (StepStatus.ACCEPTED, StepStatus.HELD_APPROVED)]
        per_tool: dict[str, dict[str, int]] = {}
        for step in drafted:
            for name in step.tools or (step.kind.value,):
                entry = per_tool.setdefault(name, {"drafted": 0, "accepted": 0})
                entry["drafted"] += 1
                entry["accepted"] += step in accepted
        rounds = self.accepted_prefixes
        return {
            "drafted_steps": len(drafted),
            "accepted_steps": len(accepted),
            "acceptance_rate": len(accepted) / len(drafted) if drafted else None,
            "rounds": len(rounds),
            "mean_accepted_prefix": sum(rounds) / len(rounds) if rounds else None,
            "held_approved": sum(s.status is StepStatus.HELD_APPROVED for s in self.steps),
            "repairs": sum(s.status is StepStatus.REPAIRED for s in self.steps),
            "malformed_drafts": sum(s.status is StepStatus.MALFORMED for s in drafted),
            "invalid_verdicts": self.invalid_verdicts,
            "continued_repairs": self.continued_repairs,
            "unsure_drafts": self.unsure_drafts,
            "committed_steps": sum(s.status is not StepStatus.REJECTED and s.status is not StepStatus.MALFORMED for s in self.steps),
            "per_tool": per_tool,
        }


class EpisodeRunner:
    """Runs one episode of one mode. Holds the per-episode state; the loop lives in ``run``."""

    def __init__(
        self, env: Environment, task_id: str, mode: str, models: Models, config: ProtocolConfig
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        needs = {"strong": ["strong"], "weak": ["weak"], "stepwise": ["strong", "weak"],
                 "specagent": ["strong", "weak", "verifier"]}[mode]
        missing = [name for name in needs if getattr(models, name) is None]
        if missing:
            raise ValueError(f"mode {mode!r} needs models: {', '.join(missing)}")
        self.env, self.mode, self.models, self.config = env, mode, models, config
        self.tools: list[ToolSpec] = env.tool_specs()
        self.read_only = classify_tools(self.tools, config.read_only, config.write,
                                        terminal=terminal_tools(env.is_terminal, self.tools))
        self.runner = ToolRunner(env.execute, config.tool_timeout_s)
        self.episode = Episode(task_id=task_id, mode=mode)
        self.done = False
        self.round = 0

    # ------------------------------------------------------------------ the loop
    def run(self, start_from: Sequence[Message] | None = None) -> Episode:
        """Run to the end. ``start_from``: continue a conversation whose state the caller
        has already put the environment in (rollouts from a cut point), instead of a reset."""
        ep = self.episode
        start = time.perf_counter()
        ep.messages = list(start_from) if start_from is not None else list(self.env.reset(ep.task_id))
        step = {"strong": self._author_round, "weak": self._author_round,
                "stepwise": self._stepwise_round, "specagent": self._specagent_round}[self.mode]
        try:
            while not self.done:
                if self._committed() >= self.config.max_steps:
                    ep.stop_reason = "max_steps"
                    break
                step()
                self.round += 1
        except ContextLengthExceeded as err:
            ep.stop_reason = f"context_length: {err}"
        ep.wall_seconds = time.perf_counter() - start
        ep.tools_still_running = self.runner.still_running()
        result = self.env.reward(ep.messages)
        ep.reward, ep.reward_info = result.reward, dict(result.info)
        ep.final_hash = self.env.state_hash()
        return ep

    def _committed(self) -> int:
        return sum(1 for m in self.episode.messages if m.role == "assistant")

    # ------------------------------------------------------------------ modes
    def _author_round(self) -> None:
        """`strong` / `weak`: the model authors the next step, which is executed."""
        who = self.mode
        completion = self._generate(who, "act", self.episode.messages)
        self._commit(completion.message, who, StepStatus.AUTHORED, completion.malformed)

    def _stepwise_round(self) -> None:
        """`stepwise`: W proposes one step, S writes its own; the draft counts as accepted
        only if it matches. S's step is the one executed (lossless)."""
        context = self.episode.messages
        proposal = self._generate("weak", "draft", context)
        authored = self._generate("strong", "act", context)
        step = drafted(proposal.message, self.read_only, proposal.malformed)
        match = step.kind is not StepKind.MALFORMED and authored.malformed is None and same_step(
            proposal.message, authored.message
        )
        status = StepStatus.ACCEPTED if match else (
            StepStatus.MALFORMED if step.kind is StepKind.MALFORMED else StepStatus.REJECTED)
        self._record(step, "weak", status)
        self.episode.accepted_prefixes.append(int(match))
        self._commit(authored.message, "strong", StepStatus.AUTHORED, authored.malformed)

    def _specagent_round(self) -> None:
        ep = self.episode
        segment = self._draft()
        ep.unsure_drafts += segment.partial is not None
        # an unfinished step alone is worth a verdict only to one that reads it (a likelihood verdict)
        reads_partial = bool(segment.partial) and getattr(self.models.verifier, "reads_partial", False)
        judged = bool(segment.verifiable) or reads_partial
        accepted, opening = self._judge(segment) if judged else (0, "")
        if not judged:
            ep.verdicts.append("(nothing to verify)")
        ep.accepted_prefixes.append(accepted)
        for i, step in enumerate(segment.steps):
            if i < accepted and not step.held:
                self._record(step, "weak", StepStatus.ACCEPTED)
                ep.messages.extend([step.message, *step.observations])
            elif i < accepted:  # the held step, approved: execute it now
                self._commit(step.message, "weak", StepStatus.HELD_APPROVED, None, record=step)
            else:
                bad = step.kind is StepKind.MALFORMED
                self._record(step, "weak", StepStatus.MALFORMED if bad else StepStatus.REJECTED)
        # a draft that dropped its next step (a repeated lookup, draft_stop_repeats): S writes that
        # step, as after a rejection (else a drafter that only repeats would stall)
        all_in = accepted == len(segment.steps) and segment.partial is None and not segment.dropped_step
        if not all_in:  # the strong model repairs step accepted+1, from a prefix of the verify prompt
            # the opening is of the step being repaired: a rejected verifiable step, or the unfinished
            # one after every drafted step was accepted (none follows a malformed step)
            opening = opening if accepted < len(segment.verifiable) or segment.partial is not None else ""
            repair = self._generate("strong", "repair", ep.messages, continuation=opening)
            ep.continued_repairs += bool(opening)
            self._commit(repair.message, "strong", StepStatus.REPAIRED, repair.malformed)

    # ------------------------------------------------------------------ pieces
    def _judge(self, segment: Segment) -> tuple[int, str]:
        """VERIFY: the accepted prefix, an int in [0, k], and the opening the repair may continue
        from (`Verdict.repair_from`). A verdict that is not one (a fraction, None, a string, out
        of range, unparseable) or a verifier that raises grants nothing and names no opening:
        every step is rejected and the first is repaired whole; the round counts as invalid."""
        ep = self.episode
        try:
            verdict, usages = self.models.verifier.verify(ep.messages, self.tools, segment)
            for model, usage in usages:
                ep.ledger.record(model, "verdict", usage, self._engine(model).cost.for_adapter(self._adapter(model)))
        except Exception as err:
            verdict, why = None, f"the verifier raised {type(err).__name__}: {err}"
        else:
            why = None
        accepted, invalid = granted_prefix(verdict, len(segment.verifiable)) if why is None else (0, why)
        # only a valid verdict's own opening of its first rejected step; a string, nothing else
        opening = getattr(verdict, "repair_from", "") if invalid is None else ""
        raw = getattr(verdict, "raw", "")
        ep.verdicts.append(raw if invalid is None else f"(invalid verdict: {invalid}) {raw}".rstrip())
        ep.invalid_verdicts += invalid is not None
        return accepted, opening if isinstance(opening, str) else ""

    def _draft(self) -> Segment:
        """DRAFT: read-only steps are executed now; the first other step ends the draft."""
        budget = min(self.config.max_draft_steps, self.config.max_steps - self._committed())
        job = DraftJob(self.episode.messages, self._execute, budget=max(budget, 1))
        cost = self.models.weak.cost.for_adapter(self.models.weak_adapter)

        def record(usage: Usage) -> None:
            self.episode.ledger.record("weak", "draft", usage, cost)

        return draft_batch(self.models.weak, [job], self.tools, self.read_only, self.config.max_tokens,
                           self.models.weak_adapter, record, self.config.draft_stop_below,
                           stop_repeats=self.config.draft_stop_repeats)[0]

    def _engine(self, model: str) -> ChatEngine:
        return self.models.strong if model == "strong" else self.models.weak

    def _adapter(self, model: str) -> str | None:
        return self.models.strong_adapter if model == "strong" else self.models.weak_adapter

    def _generate(self, model: str, role: str, context: Sequence[Message], continuation: str = "") -> Completion:
        """One step from `model`, with call ids fixed by position so runs compare byte for byte;
        ``continuation``: the text the step starts with (`ChatRequest.continuation`)."""
        adapter = self._adapter(model)
        engine = self._engine(model)
        request = ChatRequest(list(context), self.tools, self.config.max_tokens, adapter, continuation)
        completion = engine.chat([request])[0]
        self.episode.ledger.record(model, role, completion.usage, engine.cost.for_adapter(adapter))
        return replace(completion, message=assign_call_ids(completion.message, len(context)))

    def _commit(
        self,
        message: Message,
        source: Literal["weak", "strong"],
        status: StepStatus,
        malformed: str | None,
        record: DraftedStep | None = None,
    ) -> None:
        """Execute a step the protocol approved or the strong model authored, and append it.

        A malformed step cannot be executed; its raw text goes to the user as a reply."""
        step = record or drafted(message, self.read_only, malformed)
        if step.kind is StepKind.MALFORMED:
            message = Message(role="assistant", content=message.content or "")
        self._record(step, source, status)
        ep = self.episode
        ep.messages.append(message)
        for number, call in enumerate(message.tool_calls):
            writes = not self.read_only.get(call.name, False)
            if writes:  # in the write log before it runs: a write that ran is always there
                ep.write_calls.append(call.name)
            outcome = self._run(call)
            ep.messages.append(self._observation(call, outcome.observation))
            if writes and not outcome.finished:  # it may still change the state: stop, believe nothing
                ep.unknown_effects.append(call.name)
                self.done, ep.stop_reason = True, f"tool_timeout:{call.name} (effect unknown)"
                ep.messages.extend(self._observation(c, NOT_RUN) for c in message.tool_calls[number + 1:])
                return
            if self.env.is_terminal(call):
                self.done, ep.stop_reason = True, f"terminal:{call.name}"
        if not message.tool_calls:
            answer = self.env.user_turn(message.content or "")
            if answer is None:
                self.done, ep.stop_reason = True, "user_done"
            else:
                ep.messages.append(Message(role="user", content=answer))

    def _record(self, step: DraftedStep, source: Literal["weak", "strong"], status: StepStatus) -> None:
        text = step.message.content or ""
        if step.message.tool_calls:
            text = "; ".join(f"{c.name}({c.arguments})" for c in step.message.tool_calls)
        self.episode.steps.append(
            StepRecord(self.round, source, step.kind, status, step.tool_names, text[:500], step.malformed)
        )

    def _run(self, call: ToolCall):
        """Run a tool with a timeout counted from its start; a raise or a hang becomes an
        error observation (see ``ToolRunner``)."""
        outcome = self.runner.run(call)
        self.episode.env_seconds += outcome.seconds
        return outcome

    def _execute(self, call: ToolCall) -> Message:
        """A drafted read-only call, run now: its observation."""
        return self._observation(call, self._run(call).observation)

    @staticmethod
    def _observation(call: ToolCall, text: str) -> Message:
        return Message(role="tool", content=text, tool_call_id=call.id, name=call.name)


def run_episode(
    env: Environment,
    task_id: str,
    mode: str,
    models: Models,
    config: ProtocolConfig = ProtocolConfig(),
    start_from: Sequence[Message] | None = None,
) -> Episode:
    """Run one episode of ``task_id`` in ``mode`` and return its transcript and metrics."""
    return EpisodeRunner(env, task_id, mode, models, config).run(start_from)
