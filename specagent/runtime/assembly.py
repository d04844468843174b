"""Assembling a run from its config: the environment and its tasks, the engines per role,
adapters given by path, the verifier, the protocol settings; and the checks that all of it
holds before anything is written (`open_run`).

Every command that runs episodes (run, eval, serve, collect) and every stage that drafts
(mine, the training-time acceptance callback) builds its pieces here, so they cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from specagent.config import EnvConfig, ProtocolSettings, RuntimeSpec, check_resume
from specagent.core.canonical import same_step
from specagent.core.classify import classify_tools, terminal_tools
from specagent.core.errors import ConfigError
from specagent.core.files import check_output_dir
from specagent.core.interfaces import Environment, HasExpert, TokenScorer, Verifier
from specagent.core.protocol import Models, ProtocolConfig
from specagent.core.types import DraftedStep, Message
from specagent.core.verify import GenerativeVerifier, render_steps
from specagent.engines import EnginePool, build_engine
from specagent.engines.batching import batching_engines
from specagent.engines.likelihood_head import LikelihoodHead
from specagent.engines.models import find_adapter
from specagent.engines.scripted import ScriptedVerifier
from specagent.engines.verdict_head import HeadSpec, HeadVerifier, head_adapter_dir
from specagent.engines.verdict_likelihood import LikelihoodVerifier
from specagent.runtime.episodes import read_episodes
from specagent.runtime.provenance import write_run_info

# the names adapters given by path are registered under on their engines
DRAFTER_ADAPTER = "drafter"  # on the weak engine
VERDICT_ADAPTER = "verdict"  # a generative verdict adapter, on the strong engine
HEAD_ADAPTER = "verdict-head"  # a verdict head, on the strong engine


def build_env(cfg: EnvConfig) -> Environment:
    if cfg.name == "replay":
        raise ConfigError("env.name 'replay' is the recorded log of `specagent mine`; it runs no episodes")
    match cfg.name:
        case "store":
            from specagent.envs.store import StoreEnv

            return StoreEnv(tasks_path=cfg.tasks_path or None, split=cfg.split, user=cfg.user, per_kind=cfg.per_kind)
        case "airline":
            return airline_env(cfg)
        case "mcp":
            return mcp_env(cfg)
    raise ConfigError(f"env.name: unknown environment {cfg.name!r}")


def airline_env(cfg: EnvConfig) -> Environment:
    """The environment of ``env: {name: airline, airline: {data_dir, runs, user}}``."""
    settings = cfg.airline  # the schema requires it for `name: airline`
    if cfg.tasks_path:
        raise ConfigError("env.tasks_path: the airline tasks come from the runs file; set env.airline.runs instead")
    user_engine = None
    if settings.user == "simulated":  # the model that plays the user comes from here, not from the env
        try:
            user_engine = build_engine(settings.user_model)
        except ValueError as err:  # e.g. the scripted backend, which has no policy to play a user
            raise ConfigError(f"env.airline.user_model: {err}") from None
    from specagent.envs.airline import AirlineEnv

    return AirlineEnv(settings.data_dir, settings.runs, user=settings.user, user_engine=user_engine)


def mcp_env(cfg: EnvConfig) -> Environment:
    """The MCP environment of a run config (`env.name: mcp`)."""
    path = cfg.mcp.tasks_path or cfg.tasks_path
    if path is None:
        raise ConfigError("env.mcp.tasks_path: the MCP environment needs a task file (YAML or JSONL)")
    from specagent.envs.mcp import McpEnv, load_tasks

    return McpEnv(
        cfg.mcp.servers,
        load_tasks(path),
        read_only=cfg.read_only,
        write=cfg.write,
        tool_timeout_s=cfg.tool_timeout_s,
        terminal_tools=cfg.mcp.terminal_tools,
    )


def select_tasks(env: Environment, cfg: EnvConfig) -> list[str]:
    """`env.task_ids` (else every task), of `env.kinds` if given, without `env.exclude_task_ids`,
    then the first `env.limit`."""
    available = env.task_ids()
    for key in ("task_ids", "exclude_task_ids"):
        unknown = [t for t in getattr(cfg, key) or () if t not in available]
        if unknown:
            raise ConfigError(f"env.{key}: unknown task ids {unknown} (the environment has {len(available)} tasks)")
    chosen = [t for t in (cfg.task_ids if cfg.task_ids is not None else available) if t not in cfg.exclude_task_ids]
    if cfg.kinds is not None:
        kind_of = {t: env.task(t).get("kind") for t in available}
        unknown = sorted(set(cfg.kinds) - set(kind_of.values()))
        if unknown:
            raise ConfigError(f"env.kinds: no task of kind {unknown} in split {cfg.split!r} (its kinds: "
                              f"{', '.join(sorted(k for k in set(kind_of.values()) if k))})")
        chosen = [t for t in chosen if kind_of[t] in cfg.kinds]
    return chosen[: cfg.limit] if cfg.limit else chosen


def protocol_config(protocol: ProtocolSettings, env: EnvConfig) -> ProtocolConfig:
    """The protocol's settings for episodes on ``env``: its tool timeout and the user's lists."""
    return ProtocolConfig(
        max_draft_steps=protocol.max_draft_steps,
        max_steps=protocol.max_steps,
        max_tokens=protocol.max_tokens,
        draft_stop_below=protocol.draft_stop_below,
        draft_stop_repeats=protocol.draft_stop_repeats,
        tool_timeout_s=env.tool_timeout_s,
        read_only=tuple(env.read_only),
        write=tuple(env.write),
    )


def needed_roles(mode: str) -> tuple[str, ...]:
    return {"strong": ("strong",), "weak": ("weak",)}.get(mode, ("strong", "weak"))


def scripted_policy(env: Environment, configs) -> Any:
    """The environment's expert as a fake model, when a role uses the scripted backend."""
    if not any(c.backend == "scripted" for c in configs):
        return None
    return _expert(env, "the scripted backend")


def _expert(env: Environment, who: str) -> Any:
    if not isinstance(env, HasExpert):
        raise ConfigError(f"{who} needs an environment with an expert; {env.name!r} has none")
    return env.expert()


def expert_verifier(env: Environment) -> ScriptedVerifier:
    """`verifier.kind: scripted` (tests): approves the longest drafted prefix that the
    environment's expert would take, step for step."""
    policy = _expert(env, "verifier.kind scripted")

    def judge(context: Sequence[Message], steps: Sequence[DraftedStep]) -> int:
        history = list(context)
        for accepted, step in enumerate(steps):
            if not same_step(policy(history, ()), step.message):
                return accepted
            history += render_steps([step])
        return len(steps)

    return ScriptedVerifier(judge)


def adapter_dir(path: str | None) -> str | None:
    """The peft dir behind an adapter given by path (a training output's or an export's
    `adapter/`, or the dir itself); None when ``path`` is an adapter *name*."""
    if not path:
        return None
    found = find_adapter(path)
    if found is not None:
        return str(found)
    if Path(path).exists():
        raise ConfigError(f"{path}: not a peft adapter dir (no adapter_config.json in it or in its adapter/)")
    return None


def with_adapter(cfg: Any, name: str, path: str) -> Any:
    """An engine config with the peft dir `path` registered under `name`."""
    return cfg.model_copy(update={"adapters": {**cfg.adapters, name: path}})


def resolve_adapter(cfg: Any, ref: str | None, name: str, where: str = "drafter_adapter") -> tuple[Any, str | None]:
    """(engine config, the adapter name requests use) for an adapter reference: a path
    (training output, export, adapter dir) is registered on the engine as `name`; else it
    must be an adapter name of the engine (or None). An OpenAI-compatible server's adapter
    names are its own, so there any name goes. Anything else (a path that is not there, a
    misspelt name) is a ConfigError naming ``where``."""
    if path := adapter_dir(ref):
        return with_adapter(cfg, name, path), name
    if ref is None or ref in cfg.adapters or cfg.backend == "openai":
        return cfg, ref
    raise ConfigError(f"{where}: {ref!r} is neither an adapter dir nor an adapter name of the {cfg.backend} engine "
                      f"(its adapters: {', '.join(cfg.adapters) or 'none'})")


SCORING_BACKENDS = ("transformers", "vllm", "openai")  # engines that score prompt positions (a verdict head)


def check_scoring(strong: Any, kind: str) -> None:
    """Verifier `kind` (head, likelihood) reads prompt positions: the strong engine must score them.
    An OpenAI-compatible server does only through vLLM's prompt_logprobs, on token ids from the
    served model's tokenizer, so there `strong.tokenizer` must name the model's local dir."""
    if strong.backend not in SCORING_BACKENDS:
        raise ConfigError(f"verifier kind {kind!r} needs a strong engine that scores prompt positions "
                          f"({', '.join(SCORING_BACKENDS)}), not {strong.backend!r}")
    if strong.backend == "openai" and not strong.tokenizer:
        raise ConfigError(f"verifier kind {kind!r} needs a strong engine that scores prompt positions: on the "
                          "openai backend set strong.tokenizer to the served model's local dir (its tokenizer "
                          "turns the verify prompt into token ids; a vLLM server scores them)")


@dataclass(frozen=True)
class ModelPlan:
    """What `build_models` builds, settled without building anything: the engine config per
    role (adapters given by path registered), the adapter names requests use, the head dir and,
    read once from its file, the tasks its threshold was calibrated on (and a likelihood head)."""

    configs: dict[str, Any]
    weak_adapter: str | None
    verdict_adapter: str | None
    head: Path | None
    wants_verifier: bool
    calibration_tasks: tuple[str, ...] = ()
    likelihood_head: LikelihoodHead | None = None


def plan_models(cfg: RuntimeSpec, modes: tuple[str, ...]) -> ModelPlan:
    """The models of `modes`, checked as far as can be without loading one: every adapter is a
    dir or a name of its engine, a verdict head is there and its engine can score. ConfigError otherwise."""
    roles = sorted({role for mode in modes for role in needed_roles(mode)})
    configs = {r: getattr(cfg, r) for r in roles}
    weak_adapter, verdict_adapter, head = cfg.drafter_adapter, cfg.verifier.adapter, None
    calibrated_on, likelihood_head = (), None
    if "weak" in configs:
        configs["weak"], weak_adapter = resolve_adapter(configs["weak"], weak_adapter, DRAFTER_ADAPTER, "drafter_adapter")
    wants_verifier = "strong" in configs and "specagent" in modes
    if "weak" in configs and "specagent" in modes and cfg.protocol.draft_stop_below > 0 \
            and configs["weak"].backend == "openai":
        raise ConfigError("protocol.draft_stop_below: a drafter behind the openai backend cannot stop where it is "
                          "unsure (the server decodes the whole step); draft on transformers or vllm, or set it to 0")
    if wants_verifier and cfg.verifier.kind == "head":
        head = head_adapter_dir(cfg.verifier.head)
        calibrated_on = HeadSpec.load(head).calibration_tasks
        check_scoring(cfg.strong, "head")
        if not cfg.verifier.merged:  # else the strong model's own weights are the head
            configs["strong"] = with_adapter(configs["strong"], HEAD_ADAPTER, str(head))
    elif wants_verifier and cfg.verifier.kind == "likelihood":
        check_scoring(cfg.strong, "likelihood")
        if cfg.verifier.head:
            head = Path(cfg.verifier.head)
            likelihood_head = LikelihoodHead.load(head)
            calibrated_on = likelihood_head.calibration_tasks
            if cfg.verifier.threshold is None:  # its calibrated threshold
                check_likelihood_head(likelihood_head, head)
    elif wants_verifier:
        configs["strong"], verdict_adapter = resolve_adapter(configs["strong"], verdict_adapter, VERDICT_ADAPTER,
                                                             "verifier.adapter")
    return ModelPlan(configs, weak_adapter, verdict_adapter, head, wants_verifier, tuple(calibrated_on),
                     likelihood_head)


def check_models(cfg: RuntimeSpec, env: Environment, modes: tuple[str, ...], tasks: Sequence[str] = ()) -> ModelPlan:
    """`plan_models`; the scripted backend has the environment's expert to play; a verdict
    head was not calibrated on any of ``tasks`` (the ones about to be run)."""
    plan = plan_models(cfg, modes)
    scripted_policy(env, list(plan.configs.values()))
    if plan.head is not None:
        check_calibration(plan.head, plan.calibration_tasks, tasks)
    return plan


def check_likelihood_head(head: LikelihoodHead, path: Path) -> None:
    """A likelihood head degenerate at its calibrated threshold would verify nothing: refused there
    (a threshold given explicitly, e.g. a sweep's, is the user's choice)."""
    if head.degenerate:
        raise ConfigError(f"verifier.head {path}: the likelihood head is degenerate at its threshold {head.threshold:g} "
                          "(it accepts or rejects nearly every calibration step); retrain it on more, balanced drafts, or set "
                          "verifier.threshold")


def check_calibration(head: Path, calibrated_on: Sequence[str], tasks: Sequence[str]) -> None:
    """A head's threshold is chosen on its calibration rows (the tasks ``calibrated_on``);
    measuring it on their tasks would grade the threshold on its own answers. ConfigError when
    the two overlap."""
    shared = sorted(set(calibrated_on) & {str(t) for t in tasks})
    if shared:
        raise ConfigError(f"verifier.head {head}: calibrated on {len(shared)} of the tasks it would now run "
                          f"({', '.join(shared[:5])}{', ...' if len(shared) > 5 else ''}); calibrate on a split "
                          "the eval never sees (mine a calibration split, validation_tasks) or run other tasks")


def build_verifier(cfg: RuntimeSpec, plan: ModelPlan, strong: Any, env: Environment) -> Verifier:
    """Every kind of verifier, built in one place: the strong model's generative verdict (base
    weights or a verdict adapter), a trained head read at step boundaries (no token decoded),
    or the environment's expert (`scripted`, tests only)."""
    match cfg.verifier.kind:
        case "head":
            if not isinstance(strong, TokenScorer):
                raise ConfigError(f"verifier kind 'head' needs a strong engine that scores prompt positions "
                                  f"({', '.join(SCORING_BACKENDS)}), not {cfg.strong.backend!r}")
            return HeadVerifier(strong, plan.head, cfg.verifier.threshold, adapter=HEAD_ADAPTER,
                                merged=cfg.verifier.merged)
        case "likelihood":
            if not isinstance(strong, TokenScorer):
                raise ConfigError(f"verifier kind 'likelihood' needs a strong engine that scores prompt positions "
                                  f"({', '.join(SCORING_BACKENDS)}), not {cfg.strong.backend!r}")
            return LikelihoodVerifier(strong, cfg.verifier.threshold, continue_repairs=cfg.verifier.continue_repairs,
                                      head=plan.likelihood_head)
        case "scripted":
            return expert_verifier(env)
    return GenerativeVerifier(strong, adapter=plan.verdict_adapter, max_tokens=cfg.verifier.max_tokens)


def build_models(
    cfg: RuntimeSpec, env: Environment, pool: EnginePool, modes: tuple[str, ...], batch: bool = False
) -> Models:
    """Engines per role (shared where the configs match), adapters given by path registered on
    the engine that serves them, and the verifier (`build_verifier`). ``batch``: the
    engines behind BatchingEngines, for episodes run side by side (verdicts batch too)."""
    plan = plan_models(cfg, modes)
    policy = scripted_policy(env, list(plan.configs.values()))
    engines = pool.for_roles(plan.configs, scripted_policy=policy)
    if batch:
        engines = batching_engines(engines)
    strong = engines.get("strong")
    verifier = build_verifier(cfg, plan, strong, env) if plan.wants_verifier else None
    return Models(strong=strong, weak=engines.get("weak"), verifier=verifier, weak_adapter=plan.weak_adapter)


def check_tool_lists(env: Environment, cfg: EnvConfig) -> dict[str, bool]:
    """`env.read_only` / `env.write` against the environment's tools, as every episode will
    classify them: a misspelt name, or one in both lists, is a ConfigError."""
    specs = env.tool_specs()
    return classify_tools(specs, cfg.read_only, cfg.write, terminal=terminal_tools(env.is_terminal, specs))


def check_resumable(episodes: Path, saved_config: Path, cfg: Any, hint: str) -> None:
    """Before resuming into ``episodes``: every line of it is an episode (a torn last line
    aside), and if it holds any, ``cfg`` is the config they ran with, as saved in
    ``saved_config`` (`check_resume`: besides the resume-neutral keys). ConfigError or TaskFileError."""
    if read_episodes(episodes):
        check_resume(saved_config, cfg, hint)


RESUME_HINT = ("run with the saved config, or set resume: false to start over, or choose another output_dir")


def open_run(cfg: Any, check: Callable[[Environment, list[str]], Any] | None = None
             ) -> tuple[Environment, list[str], Path, Path]:
    """What `run` and `eval` start from: the environment, its selected tasks, the output dir
    (config and versions written) and its episodes file (emptied unless resuming).

    Everything is checked before anything is written: the environment and its tasks, the tool
    lists, ``check(env, tasks)`` (the caller's models: adapters, verdict head, the scripted backend's
    expert), the output dir, and when resuming the episodes there and the config they ran
    with. So a bad config leaves the output dir as it was."""
    env = build_env(cfg.env)
    try:
        tasks = select_tasks(env, cfg.env)
        check_tool_lists(env, cfg.env)
        if check is not None:
            check(env, tasks)
        out_dir = check_output_dir(cfg.output_dir, "output_dir")
        episodes = out_dir / "episodes.jsonl"
        if cfg.resume:
            check_resumable(episodes, out_dir / "config.yaml", cfg, RESUME_HINT)
        write_run_info(out_dir, cfg)
    except BaseException:
        env.close()
        raise
    if not cfg.resume and episodes.exists():
        episodes.unlink()
    return env, tasks, out_dir, episodes
