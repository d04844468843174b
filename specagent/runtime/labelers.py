"""Per-step validity labels for drafted segments (DESIGN §2). Labels are prefix-closed.

- `match`: a drafted step is valid if it is equivalent to what the strong trajectory
  does next within a window; read-only lookups may come in another order; replies are
  compared by a pluggable text judge.
- `judge`: the strong model grades the drafted steps with the strong continuation as
  reference and returns the first invalid index.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from specagent.core.canonical import normalise_text, same_step
from specagent.core.interfaces import ChatEngine, ChatRequest
from specagent.core.types import DraftedStep, Message, StepKind, ToolSpec, Usage
from specagent.core.verify import parse_verdict, verify_messages

TextJudge = Callable[[str, str], bool]

_KEY_TOKEN = re.compile(r"[a-z]*\d[\w.\-]*")


def overlap_judge(draft: str, reference: str, min_f1: float = 0.5) -> bool:
    """The cheap default text judge: every id/number the reference states is stated by
    the draft, and the word overlap (F1) is at least ``min_f1``."""
    d, r = normalise_text(draft), normalise_text(reference)
    if not set(_KEY_TOKEN.findall(r)) <= set(_KEY_TOKEN.findall(d)):
        return False
    dw, rw = d.split(), r.split()
    if not dw or not rw:
        return dw == rw
    common = len(set(dw) & set(rw))
    precision, recall = common / len(set(dw)), common / len(set(rw))
    return precision + recall > 0 and 2 * precision * recall / (precision + recall) >= min_f1


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
    judge: TextJudge = overlap_judge,
) -> list[int]:
    """Label drafted steps against the strong continuation.

    The window is the next ``window`` strong steps, cut after the first one that is not
    a pure lookup. A drafted lookup is valid if it equals any unmatched lookup of the
    window (order may differ); a drafted write or reply is valid if it matches the
    window's first non-lookup step (a reply through ``judge``).
    """
    window_steps = []
    for ref in reference[:window]:
        window_steps.append(ref)
        if not _is_lookup(ref, read_only):
            break
    lookups = [r for r in window_steps if _is_lookup(r, read_only)]
    action = next((r for r in window_steps if not _is_lookup(r, read_only)), None)
    valid = []
    for step in steps:
        if step.kind is StepKind.MALFORMED:
            valid.append(False)
        elif step.kind is StepKind.READ:
            hit = next((r for r in lookups if same_step(step.message, r)), None)
            if hit is not None:
                lookups.remove(hit)
            valid.append(hit is not None)
        elif action is None:
            valid.append(False)
        elif step.kind is StepKind.REPLY:
            valid.append(not action.tool_calls and judge(step.message.content or "", action.content or ""))
        else:
            valid.append(same_step(step.message, action))
    return prefix_closed(valid)


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


def rollout_labels(
    restore_env: Callable[[], Any],
    task_id: str,
    context: Sequence[Message],
    steps: Sequence[DraftedStep],
    strong: ChatEngine,
    max_steps: int = 8,
    max_tokens: int = 256,
) -> tuple[list[int], list[float]]:
    """`rollout` labels (Monte-Carlo): for each drafted prefix d1..dj, a live environment
    restored to the cut point takes the prefix (the held step executed as if approved),
    the strong model continues for up to ``max_steps`` steps, and the environment scores
    the episode. Step j is valid if that reward is at least the reward of the strong
    model continuing from the cut point alone. Returns (labels, rewards with the
    baseline first)."""
    from specagent.core.protocol import Models, ProtocolConfig, run_episode

    rewards = []
    for j in range(len(steps) + 1):
        env = restore_env()
        messages = list(context)
        finished = False
        for step in steps[:j]:
            messages.append(step.message)
            if step.observations:
                messages.extend(step.observations)
                continue
            for call in step.message.tool_calls:  # the held write, executed as approved
                messages.append(Message(role="tool", content=env.execute(call), tool_call_id=call.id, name=call.name))
            if not step.message.tool_calls:  # a held reply: the user answers or the conversation ends
                answer = env.user_turn(step.message.content or "")
                finished = answer is None
                if answer is not None:
                    messages.append(Message(role="user", content=answer))
        if finished:
            rewards.append(env.reward(messages).reward)
            continue
        budget = ProtocolConfig(max_steps=sum(m.role == "assistant" for m in messages) + max_steps, max_tokens=max_tokens)
        episode = run_episode(env, task_id, "strong", Models(strong=strong), budget, start_from=messages)
        rewards.append(episode.reward)
    baseline = rewards[0]
    valid = [step.kind is not StepKind.MALFORMED and r >= baseline for step, r in zip(steps, rewards[1:])]
    return prefix_closed(valid), rewards
