"""`episodes.jsonl`: one finished episode per line (`specagent.episode/v1`), written by every
command that runs episodes (run, eval, collect, serve) and read by resume and the report."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from specagent.core.protocol import Episode
from specagent.records.base import Record

EPISODE_FORMAT = "specagent.episode/v1"


class EpisodeRecord(Record):
    """One episode: who played, what it scored, what it cost (DESIGN §3) and its transcript."""

    format: Literal["specagent.episode/v1"] = EPISODE_FORMAT
    task_id: str
    mode: str
    arm: str  # the eval arm; the mode outside an eval
    trial: int = Field(ge=0)
    models: dict[str, str] = Field(default_factory=dict)
    reward: float
    reward_info: dict[str, Any] = Field(default_factory=dict)
    stop_reason: str
    counts: dict[str, Any]  # Episode.counts(): drafted/accepted steps, rounds, repairs, invalid verdicts, per tool
    accepted_prefixes: list[int]
    verdicts: list[str]
    ledger: dict[str, Any]  # Ledger.to_json(): per model and role
    wall_seconds: float
    env_seconds: float
    final_hash: str
    write_calls: list[str]
    unknown_effects: list[str] = Field(default_factory=list)  # writes that timed out while running
    steps: list[dict[str, Any]]  # StepRecord.to_json()
    messages: list[dict[str, Any]]  # OpenAI chat format

    @classmethod
    def of(cls, ep: Episode, trial: int, models: dict[str, str], arm: str | None = None) -> "EpisodeRecord":
        return cls(
            task_id=ep.task_id, mode=ep.mode, arm=arm or ep.mode, trial=trial, models=models, reward=ep.reward,
            reward_info=ep.reward_info, stop_reason=ep.stop_reason, counts=ep.counts(),
            accepted_prefixes=ep.accepted_prefixes, verdicts=ep.verdicts, ledger=ep.ledger.to_json(),
            wall_seconds=ep.wall_seconds, env_seconds=ep.env_seconds, final_hash=ep.final_hash,
            write_calls=ep.write_calls, unknown_effects=ep.unknown_effects, steps=[s.to_json() for s in ep.steps],
            messages=[m.to_openai() for m in ep.messages],
        )

    def key(self) -> tuple[str, str, int]:
        """(task, arm, trial): what a resumed run skips."""
        return self.task_id, self.arm, self.trial


class StartedEpisode(Record):
    """One line of `episodes.started.jsonl`: an episode that began (runtime/episodes.py,
    `StartJournal`), keyed as its finished record would be."""

    task_id: str
    arm: str
    trial: int
