"""Read-only classification of tools (DESIGN §1).

Precedence: the user's explicit lists > the environment's declaration > write.
Unknown means unsafe, and a server's hint never beats the user's configuration.
Two more rules close the holes an adversary would use:
- a terminal tool (a transfer, a finish) is never read-only, whatever it is declared as,
  so drafting holds it and the episode ends when it runs;
- two specs of one name that disagree make the name a write tool.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence

from specagent.core.errors import ConfigError
from specagent.core.types import DraftedStep, Message, StepKind, ToolCall, ToolSpec


def classify_tools(
    specs: Sequence[ToolSpec],
    read_only: Iterable[str] = (),
    write: Iterable[str] = (),
    terminal: Iterable[str] = (),
    strict: bool = True,
) -> dict[str, bool]:
    """Map tool name -> True if read-only.

    Names in both user lists are an error; so are names no spec has (a misspelt name would
    silently leave the environment's declaration in charge), unless ``strict`` is False
    (a single trajectory may not list every tool of its domain)."""
    allow, deny, ends = set(read_only), set(write), set(terminal)
    both = sorted(allow & deny)
    if both:
        raise ConfigError(f"tools listed as both read_only and write: {', '.join(both)}")
    names = {spec.name for spec in specs}
    if strict:
        check_tool_names(allow, names, "read_only")
        check_tool_names(deny, names, "write")
    result: dict[str, bool] = {}
    for spec in specs:
        if spec.name in deny or spec.name in ends:
            flag = False
        elif spec.name in allow:
            flag = True
        else:
            flag = spec.read_only is True
        result[spec.name] = flag and result.get(spec.name, True)
    return result


def check_tool_names(listed: Iterable[str], known: Iterable[str], key: str) -> None:
    """Raise a ConfigError naming every listed tool that is not a known one, with a guess."""
    known = sorted(set(known))
    problems = []
    for name in sorted(set(listed) - set(known)):
        guess = difflib.get_close_matches(name, known, n=1)
        problems.append(f"{name!r}" + (f" (did you mean {guess[0]!r}?)" if guess else ""))
    if problems:
        raise ConfigError(f"env.{key}: unknown tool(s) {', '.join(problems)}; the environment's tools: "
                          f"{', '.join(known) or '(none)'}")


def terminal_tools(is_terminal, specs: Sequence[ToolSpec]) -> list[str]:
    """The names among ``specs`` that an environment's ``is_terminal`` calls terminal.

    ``Environment.is_terminal`` decides by the call's tool, so asking with empty arguments
    gives each tool's answer."""
    return [spec.name for spec in specs if is_terminal(ToolCall(id="", name=spec.name, arguments={}))]


def step_kind(message: Message, read_only: dict[str, bool], malformed: str | None = None) -> StepKind:
    """What executing ``message`` would do. Tools missing from the map count as write."""
    if malformed is not None:
        return StepKind.MALFORMED
    if not message.tool_calls:
        return StepKind.REPLY if (message.content or "").strip() else StepKind.MALFORMED
    if all(read_only.get(call.name, False) is True for call in message.tool_calls):
        return StepKind.READ
    return StepKind.WRITE


def drafted(message: Message, read_only: dict[str, bool], malformed: str | None) -> DraftedStep:
    kind = step_kind(message, read_only, malformed)
    if kind is StepKind.MALFORMED and malformed is None:
        malformed = "empty step"
    return DraftedStep(message=message, kind=kind, malformed=malformed)


def failed_call(observation: str | None) -> bool:
    """Whether a tool observation reports a failed call (a bad id, a policy refusal, a
    timeout): it starts with "Error", tau-bench's convention, which every environment here
    follows."""
    return (observation or "").startswith("Error")


def changed_state(read_only: bool | None, observation: str) -> bool:
    """Whether a recorded call changed the state: a tool not known to be read-only (unknown
    means write) whose result is not an error (`failed_call`). Replay tracks state by these
    calls; tasks made from runs take them as gold."""
    return not read_only and not failed_call(observation)
