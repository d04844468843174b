"""Configuration: one pydantic schema per command; YAML gives values, `key.sub=value`
overrides them, unknown keys are errors, and every problem is reported at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specagent.core.errors import ConfigError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class EngineConfig(Strict):
    """A model backend. Engines with the same backend/model/options are shared across roles."""

    backend: Literal["transformers", "vllm", "openai", "scripted"] = "transformers"
    model: str = "smollm2"  # hub id, local dir, .gguf path, or the `smollm2` alias (DESIGN §5)
    gguf_file: Optional[str] = None
    adapters: dict[str, str] = Field(default_factory=dict)  # LoRA name -> path, served side by side
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    max_model_len: int = Field(4096, gt=0)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    batch_size: int = Field(8, gt=0)
    threads: Optional[int] = Field(None, gt=0)  # transformers: torch CPU threads (None: all cores)
    # vllm: passed to vllm.LLM unchanged (tensor_parallel_size, gpu_memory_utilization, ...)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # openai-compatible endpoint
    base_url: Optional[str] = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0)
    # scripted (tests only): `expert` replays the environment's gold solution, `reply` just answers
    script: Literal["expert", "reply"] = "expert"

    @model_validator(mode="after")
    def _openai_needs_url(self) -> "EngineConfig":
        if self.backend == "openai" and not self.base_url:
            raise ValueError("backend 'openai' needs base_url (e.g. http://127.0.0.1:8000/v1)")
        return self

    def share_key(self) -> tuple:
        """Roles whose engines have the same key get one engine instance."""
        return tuple((k, repr(v)) for k, v in self.model_dump().items() if k != "adapters")


class AirlineEnvSettings(Strict):
    """The live tau-bench airline domain (specagent/envs/airline): data the user points at."""

    data_dir: str  # holds flights.json, users.json, reservations.json (not shipped)
    runs: Optional[str] = None  # tau-bench runs file (tasks, policy); None: the one other *.json in data_dir
    user: Literal["ticket", "simulated"] = "ticket"
    user_model: Optional[EngineConfig] = None  # user: simulated: the model that plays the user

    @model_validator(mode="after")
    def _simulated_needs_a_model(self) -> "AirlineEnvSettings":
        if self.user == "simulated" and self.user_model is None:
            raise ValueError("user 'simulated' needs `user_model:` (an engine that plays the user)")
        return self


class McpServerSettings(Strict):
    """One MCP server: a stdio `command` (argv; a leading `python` is the interpreter running
    specagent) or a streamable-HTTP `url` (e.g. http://127.0.0.1:8000/mcp)."""

    name: str
    command: Optional[list[str]] = Field(None, min_length=1)
    url: Optional[str] = None
    env: dict[str, str] = Field(default_factory=dict)  # stdio: extra environment variables
    # stdio: a fresh server process for every task, for servers that keep their state in memory
    restart_each_task: bool = False

    @model_validator(mode="after")
    def _one_transport(self) -> "McpServerSettings":
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (stdio) or `url` (streamable HTTP)")
        if self.restart_each_task and self.command is None:
            raise ValueError("restart_each_task needs a stdio `command`: specagent cannot restart an HTTP server")
        return self


class McpEnvSettings(Strict):
    """Tools from MCP servers (specagent/envs/mcp); tasks from a YAML/JSONL file."""

    servers: list[McpServerSettings] = Field(min_length=1)
    tasks_path: Optional[str] = None
    terminal_tools: list[str] = Field(default_factory=list)  # calls that end the conversation

    @model_validator(mode="after")
    def _unique_names(self) -> "McpEnvSettings":
        names = [server.name for server in self.servers]
        if len(set(names)) != len(names):
            raise ValueError(f"server names must be unique, got {names}")
        return self


class EnvConfig(Strict):
    name: Literal["store", "airline", "mcp"] = "store"
    airline: Optional[AirlineEnvSettings] = None  # name: airline
    mcp: Optional[McpEnvSettings] = None  # name: mcp
    tasks_path: Optional[str] = None  # a JSONL task file instead of the built-in tasks
    # store only: a generated split on the extended database (None: the 42 hand-checked tasks on the seed one)
    split: Optional[Literal["train", "calibration", "eval"]] = None
    # store only: "ticket" = the opening says everything; "multi_turn" = identity and order ids only when asked
    user: Literal["ticket", "multi_turn"] = "ticket"
    task_ids: Optional[list[str]] = None
    limit: Optional[int] = Field(None, gt=0)  # the first N tasks
    read_only: list[str] = Field(default_factory=list)  # user allow list (beats the environment)
    write: list[str] = Field(default_factory=list)  # user deny list (beats the environment)
    tool_timeout_s: float = Field(30.0, gt=0)


class VerifierConfig(Strict):
    """How the strong model judges a drafted segment: a decoded verdict or a trained head."""

    kind: Literal["generative", "head"] = "generative"
    adapter: Optional[str] = None  # generative: a verdict adapter name on the strong engine
    head: Optional[str] = None  # head: a `specagent export` dir of a verdict head
    threshold: Optional[float] = Field(None, gt=0.0, lt=1.0)  # head: None = the calibrated one
    max_tokens: int = Field(8, gt=0)

    @model_validator(mode="after")
    def _head_needs_path(self) -> "VerifierConfig":
        if self.kind == "head" and not self.head:
            raise ValueError("verifier kind 'head' needs `head:` (the export dir of a verdict head)")
        return self


class ProtocolSettings(Strict):
    max_draft_steps: int = Field(4, gt=0)
    max_steps: int = Field(16, gt=0)
    max_tokens: int = Field(192, gt=0)


class RunConfig(Strict):
    """`specagent run`: episodes of one mode on one environment."""

    mode: Literal["strong", "weak", "stepwise", "specagent"] = "specagent"
    env: EnvConfig = Field(default_factory=EnvConfig)
    strong: EngineConfig = Field(default_factory=EngineConfig)
    weak: EngineConfig = Field(default_factory=EngineConfig)
    drafter_adapter: Optional[str] = None  # an adapter name on the weak engine
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings)
    trials: int = Field(1, gt=0)
    # episodes side by side, one thread each; their requests batch in the engines
    concurrency: int = Field(1, gt=0)
    output_dir: str = "runs/run"
    resume: bool = True
    transcript: bool = True


class ServeVerifierConfig(VerifierConfig):
    """The verifier of `specagent serve`. `scripted` (tests only): approves the drafted steps
    that the environment's expert would take, with no model."""

    kind: Literal["generative", "head", "scripted"] = "generative"


class ServeConfig(Strict):
    """`specagent serve`: the runtime as an HTTP service (episodes, OpenAI-compatible chat, metrics)."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    strong: EngineConfig = Field(default_factory=EngineConfig)
    weak: EngineConfig = Field(default_factory=EngineConfig)
    drafter_adapter: Optional[str] = None  # an adapter name on the weak engine
    verifier: ServeVerifierConfig = Field(default_factory=ServeVerifierConfig)
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings)
    host: str = "127.0.0.1"
    port: int = Field(8100, gt=0, lt=65536)
    # the modes a client may ask /v1/episodes for; `weak` runs a weak model's writes unsupervised
    modes: list[Literal["strong", "weak", "stepwise", "specagent"]] = Field(
        default_factory=lambda: ["specagent"], min_length=1)
    max_conversations: int = Field(64, gt=0)  # live chat conversations kept (each holds its environment)
    max_request_bytes: int = Field(1_000_000, gt=0)  # larger request bodies get 413
    max_pending: int = Field(32, gt=0)  # episode/chat requests queued or running; beyond: 503
    # the name of an environment variable holding a bearer token every request but /health must carry
    # (Authorization: Bearer ...); None: no auth, which is only safe on a loopback host
    api_key_env: Optional[str] = None

    @model_validator(mode="after")
    def _unique_modes(self) -> "ServeConfig":
        if len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes repeats a mode: {self.modes}")
        return self


class ArmConfig(Strict):
    """One arm of an eval: a protocol mode and what the models carry in it."""

    name: str = Field(min_length=1)
    mode: Literal["strong", "weak", "stepwise", "specagent"]
    drafter_adapter: Optional[str] = None  # a path, or an adapter name of the weak engine
    verifier: Optional[VerifierConfig] = None  # specagent only; None: the generative verdict
    threshold_sweep: Optional[list[float]] = Field(None, min_length=1)  # head verifier: one run per threshold

    @model_validator(mode="after")
    def _consistent(self) -> "ArmConfig":
        if "@" in self.name:
            raise ValueError(f"arm name {self.name!r}: '@' is reserved for threshold-sweep runs (name@threshold)")
        if self.drafter_adapter and self.mode == "strong":
            raise ValueError(f"arm {self.name!r}: mode 'strong' has no drafter; drop drafter_adapter")
        if self.verifier and self.mode != "specagent":
            raise ValueError(f"arm {self.name!r}: only mode 'specagent' uses a verifier")
        if self.threshold_sweep is not None:
            if self.verifier is None or self.verifier.kind != "head":
                raise ValueError(f"arm {self.name!r}: threshold_sweep needs a head verifier (verifier.kind: head)")
            if not all(0.0 < t < 1.0 for t in self.threshold_sweep):
                raise ValueError(f"arm {self.name!r}: every threshold_sweep value must lie in (0, 1)")
            if len(set(self.threshold_sweep)) < len(self.threshold_sweep):
                raise ValueError(f"arm {self.name!r}: threshold_sweep repeats a value")
        return self


def _default_arms() -> list[ArmConfig]:
    return [ArmConfig(name=mode, mode=mode) for mode in ("strong", "weak", "stepwise", "specagent")]


class EvalConfig(Strict):
    """`specagent eval`: a matrix of arms on one environment's tasks, one engine per distinct
    model for the whole matrix, and the report."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    strong: EngineConfig = Field(default_factory=EngineConfig)
    weak: EngineConfig = Field(default_factory=EngineConfig)
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings)
    arms: list[ArmConfig] = Field(default_factory=_default_arms, min_length=1)
    trials: int = Field(1, gt=0)
    concurrency: int = Field(1, gt=0)  # episodes of an arm run side by side; their calls batch in the engines
    output_dir: str = "runs/eval"
    resume: bool = True

    @model_validator(mode="after")
    def _unique_arm_names(self) -> "EvalConfig":
        names = [arm.name for arm in self.arms]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"arm names must be unique; repeated: {', '.join(repeated)}")
        return self


class MineConfig(Strict):
    """`specagent mine`: drafted segments at every cut point of strong trajectories, labeled."""

    trajectories: str  # a trajectories.jsonl (from `specagent collect` or `specagent import`)
    output_dir: str = "runs/mined"
    drafter: EngineConfig = Field(default_factory=EngineConfig)
    drafter_adapter: Optional[str] = None  # a path (training output, export), or an adapter name of the drafter
    env: Literal["replay", "store", "airline"] = "replay"  # replay the log, or a live environment
    env_tasks_path: Optional[str] = None  # task file of the live environment (airline: the tau-bench runs file)
    env_data_dir: Optional[str] = None  # env: airline: the tau-bench airline data dir
    read_only: list[str] = Field(default_factory=list)
    write: list[str] = Field(default_factory=list)
    # the first labeler gives the dataset's labels; all are kept in segments (`all_labels`)
    labelers: list[Literal["match", "judge", "rollout"]] = Field(default_factory=lambda: ["match"], min_length=1)
    strong: Optional[EngineConfig] = None  # the strong model: `judge` and `rollout` labelers
    rollout_steps: int = Field(8, gt=0)  # strong steps per rollout
    window: int = Field(4, gt=0)
    max_draft_steps: int = Field(4, gt=0)
    max_tokens: int = Field(192, gt=0)
    validation_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    validation_tasks: Optional[list[str]] = None  # explicit validation tasks (beats the fraction)
    stride: int = Field(1, gt=0)  # every k-th trajectory (e.g. 4: one trial per task of tau-bench runs)
    limit: Optional[int] = Field(None, gt=0)  # then the first N trajectories
    max_cuts_per_trajectory: Optional[int] = Field(None, gt=0)  # evenly spaced cut points
    # also add the strong model's own next steps at each cut as valid segments (verdict data only)
    reference_segments: bool = False
    batch_trajectories: int = Field(1, gt=0)  # trajectories drafted together (bigger engine batches)

    @model_validator(mode="after")
    def _labelers_have_what_they_need(self) -> "MineConfig":
        if {"judge", "rollout"} & set(self.labelers) and self.strong is None:
            raise ValueError("labelers 'judge' and 'rollout' need a `strong` engine")
        if "rollout" in self.labelers and self.env == "replay":
            raise ValueError("labeler 'rollout' needs a live environment (env: store or airline), not the replay log")
        if self.env == "airline" and not self.env_data_dir:
            raise ValueError("env 'airline' needs `env_data_dir:` (the tau-bench airline data dir)")
        return self

    def live_env_config(self) -> EnvConfig:
        """The live environment's config (env: store or airline)."""
        if self.env == "airline":
            airline = AirlineEnvSettings(data_dir=self.env_data_dir, runs=self.env_tasks_path)
            return EnvConfig(name="airline", airline=airline)
        return EnvConfig(name=self.env, tasks_path=self.env_tasks_path)


class CollectConfig(Strict):
    """`specagent collect`: the strong model's runs on an environment, as trajectories.jsonl."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    strong: EngineConfig = Field(default_factory=EngineConfig)
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings)
    trials: int = Field(1, gt=0)
    output: str = "runs/collect/trajectories.jsonl"
    min_reward: Optional[float] = None  # keep only runs at or above this reward


C = TypeVar("C", bound=BaseModel)


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        out.append((key.strip(), yaml.safe_load(raw) if raw != "" else None))
    return out


def format_errors(err: ValidationError, source: str) -> str:
    lines = [f"{source}: {len(err.errors())} problem(s) in the configuration:"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = "unknown key (check the spelling; --dump-config shows valid keys)" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  - {where}: {msg}")
    return "\n".join(lines)


def load_config(schema: type[C], path: str | Path | None, overrides: list[str] = ()) -> C:
    """YAML file -> dotted overrides -> validated config. Raises ConfigError listing every problem."""
    tree: dict[str, Any] = {}
    source = str(path) if path else "<defaults>"
    if path is not None:
        try:
            tree = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys")
    for key, value in parse_overrides(list(overrides)):
        set_dotted(tree, key, value)
    try:
        return schema.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(format_errors(err, source)) from None


def dump_config(config: BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


# --------------------------------------------------------------------- train stage


class LoraSettings(Strict):
    """peft LoraConfig fields; `target_modules: all-linear` adapts every linear layer but the output head."""

    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class OptimSettings(Strict):
    """The optimisation loop (transformers TrainingArguments); `extra` goes to it unchanged."""

    epochs: float = Field(1.0, gt=0)
    max_steps: int = -1  # > 0 overrides epochs
    batch_size: int = Field(1, gt=0)  # per device
    grad_accum: int = Field(1, gt=0)
    learning_rate: float = Field(2e-4, gt=0)
    lr_scheduler: str = "cosine"
    warmup_steps: float = Field(0.03, ge=0)  # < 1: a fraction of the total steps
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    bf16: bool = False  # bf16 mixed precision (GPU, or CPU autocast)
    gradient_checkpointing: bool = False
    logging_steps: int = Field(1, gt=0)
    save_steps: int = Field(50, gt=0)
    save_total_limit: Optional[int] = Field(2, gt=0)
    seed: int = 0
    threads: Optional[int] = Field(None, gt=0)  # torch CPU threads (None: all cores this process may use)
    report_to: list[str] = Field(default_factory=list)  # e.g. [tensorboard], [wandb]
    extra: dict[str, Any] = Field(default_factory=dict)  # any other TrainingArguments / SFTConfig field


class AcceptanceSettings(Strict):
    """Offline acceptance during training (DESIGN §3): every `every_steps` the model being trained
    drafts at the cut points of held-out trajectories, labeled exactly as `specagent mine` does."""

    mined: str  # a `specagent mine` output dir: its trajectories, validation tasks and labeler settings
    every_steps: int = Field(50, gt=0)
    at_start: bool = True  # measure before the first step too (the "before" figure)
    limit: Optional[int] = Field(8, gt=0)  # validation trajectories used
    max_cuts_per_trajectory: Optional[int] = Field(4, gt=0)
    max_tokens: Optional[int] = Field(None, gt=0)  # None: the mine config's
    batch_size: int = Field(8, gt=0)


class DrafterTrainConfig(Strict):
    """`specagent train drafter`: LoRA SFT of the weak model on the mined `drafter` dataset."""

    # the `drafter` DatasetDict of a `specagent mine` output dir, or trajectories.jsonl file(s)
    # (`specagent collect` / `import`; a list is concatenated): every trajectory a training row
    dataset: str | list[str]
    model: str = "smollm2"  # hub id, local dir, .gguf path, or the `smollm2` alias
    gguf_file: Optional[str] = None
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    output_dir: str = "runs/train/drafter"
    resume: bool = True  # continue from the last checkpoint in output_dir, if any
    max_length: Optional[int] = Field(2048, gt=0)  # tokens per example (the start is kept: system prompt, tools)
    min_reward: Optional[float] = None  # keep only trajectories with reward >= this (unknown reward: dropped)
    limit: Optional[int] = Field(None, gt=0)  # the first N training rows (smoke runs)
    # how rows show tools and policy (engines/render.py PROFILES: full, signatures, compact, bare); saved
    # with the adapter, so the runtime serves it the same way. None: the base model's own (full if none)
    prompt_profile: Optional[Literal["full", "signatures", "compact", "bare"]] = None
    # derive the drafter from `model` itself: keep its first k decoder layers and its LM head (self-speculative,
    # as LayerSkip / Kangaroo); the output is then a full checkpoint in output_dir/model (a LoRA merged into it)
    from_layers: Optional[int] = Field(None, gt=0)
    lora: Optional[LoraSettings] = Field(default_factory=LoraSettings)  # null: full fine-tuning
    train: OptimSettings = Field(default_factory=OptimSettings)
    acceptance: Optional[AcceptanceSettings] = None


class VerdictTrainConfig(Strict):
    """`specagent train verdict`: a verdict head (`head`) or a generative verdict adapter (`generative`)
    for the strong model, on the mined `verdict` dataset."""

    kind: Literal["head", "generative"] = "head"
    dataset: str  # the `verdict` DatasetDict of a `specagent mine` output dir
    model: str = "smollm2"
    gguf_file: Optional[str] = None
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    output_dir: str = "runs/train/verdict"
    resume: bool = True
    max_length: Optional[int] = Field(8192, gt=0)  # longer verify prompts are left out (never cut)
    limit: Optional[int] = Field(None, gt=0)
    target_false_accept: float = Field(0.05, gt=0.0, lt=1.0)  # threshold calibration (head)
    eval_limit: Optional[int] = Field(None, gt=0)  # validation rows scored at the end
    eval_max_tokens: int = Field(8, gt=0)  # generative: the verdict's decode budget
    lora: LoraSettings = Field(default_factory=LoraSettings)
    train: OptimSettings = Field(default_factory=OptimSettings)
