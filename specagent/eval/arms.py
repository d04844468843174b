"""The arms of an eval as runs: a threshold sweep expands to one run per threshold, and
every arm's adapters are registered on the one engine that serves them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from specagent.config import ArmConfig, EvalConfig, RuntimeSpec, VerifierConfig
from specagent.core.errors import ConfigError
from specagent.engines.verdict_head import head_adapter_dir
from specagent.runtime.assembly import HEAD_ADAPTER, adapter_dir, needed_roles


@dataclass(frozen=True)
class ArmRun:
    """One column of the matrix: an arm, or one threshold of a head arm's sweep."""

    label: str  # the `arm` of its episodes: the arm's name, or name@threshold
    arm: ArmConfig
    threshold: float | None = None


def expand_arms(arms: Sequence[ArmConfig]) -> list[ArmRun]:
    """The arms in config order, a threshold sweep expanded into one run per threshold."""
    runs: list[ArmRun] = []
    for arm in arms:
        if arm.threshold_sweep is None:
            runs.append(ArmRun(arm.name, arm))
        else:
            runs += [ArmRun(f"{arm.name}@{t}", arm, t) for t in arm.threshold_sweep]
    return runs


def _register(adapters: dict[str, str], ref: str | None, name: str, where: str) -> str | None:
    """The adapter name for ``ref`` on an engine: ``ref`` itself if the engine knows that name,
    else the adapter dir it points at, registered as ``name`` unless already there."""
    if ref is None or ref in adapters:
        return ref
    path = adapter_dir(ref)
    if path is None:
        raise ConfigError(f"{where}: {ref!r} is neither an adapter name of the engine "
                          f"({', '.join(adapters) or 'it has none'}) nor an adapter dir")
    by_path = {known_path: known for known, known_path in adapters.items()}
    if path not in by_path:
        adapters[name] = path
    return by_path.get(path, name)


def with_shared_adapters(cfg: EvalConfig) -> EvalConfig:
    """Register every arm's adapters on the engine that serves them (drafters on the weak
    engine, or on the arm's own weak model; verdict adapters and the verdict head on the
    strong one) and let the arms name them, so that one engine per model, built once, serves
    the whole matrix."""
    weak, strong = dict(cfg.weak.adapters), dict(cfg.strong.adapters)
    arms = []
    for i, arm in enumerate(cfg.arms):
        verifier = arm.verifier
        if verifier is not None and verifier.kind == "generative" and verifier.adapter:
            name = _register(strong, verifier.adapter, f"{arm.name}-verdict", f"arms.{i}.verifier.adapter")
            verifier = verifier.model_copy(update={"adapter": name})
        own = dict(arm.weak.adapters) if arm.weak is not None else weak
        drafter = _register(own, arm.drafter_adapter, f"{arm.name}-drafter", f"arms.{i}.drafter_adapter")
        arm_weak = arm.weak.model_copy(update={"adapters": own}) if arm.weak is not None else None
        arms.append(arm.model_copy(update={"drafter_adapter": drafter, "verifier": verifier, "weak": arm_weak}))
    heads = {str(head_adapter_dir(arm.verifier.head)) for arm in cfg.arms
             if arm.verifier is not None and arm.verifier.kind == "head" and not arm.verifier.merged}
    if len(heads) > 1:
        raise ConfigError(f"arms: one verdict head per eval (the strong engine serves it as adapter "
                          f"{HEAD_ADAPTER!r}); these arms use {len(heads)}: {', '.join(sorted(heads))}")
    if heads:
        strong[HEAD_ADAPTER] = heads.pop()
    return cfg.model_copy(update={
        "arms": arms,
        "weak": cfg.weak.model_copy(update={"adapters": weak}),
        "strong": cfg.strong.model_copy(update={"adapters": strong}),
    })


def arm_spec(cfg: EvalConfig, run: ArmRun) -> RuntimeSpec:
    """The runtime of one arm: the eval's environment, models and protocol, with the arm's
    drafter adapter, verifier (at the sweep's threshold) and drafting settings."""
    verifier = run.arm.verifier or VerifierConfig()
    if run.threshold is not None:
        verifier = verifier.model_copy(update={"threshold": run.threshold})
    drafting = run.arm.drafting.model_dump(exclude_none=True) if run.arm.drafting else {}
    return RuntimeSpec(env=cfg.env, strong=cfg.strong, weak=run.arm.weak or cfg.weak,
                       drafter_adapter=run.arm.drafter_adapter, verifier=verifier,
                       protocol=cfg.protocol.model_copy(update=drafting))


def arm_engines(cfg: EvalConfig, runs: list[ArmRun]) -> dict[str, Any]:
    """The engine config of every role every run needs, keyed `role` (the eval's own) or
    `role@label` (an arm's own weak model): an `EnginePool` builds each distinct one once."""
    engines: dict[str, Any] = {}
    for run in runs:
        spec = arm_spec(cfg, run)
        for role in needed_roles(run.arm.mode):
            own = role == "weak" and run.arm.weak is not None
            engines[f"{role}@{run.label}" if own else role] = getattr(spec, role)
    return engines
