"""The one `specagent` command. One small function per subcommand; heavy imports inside."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, get_args

from specagent.core.errors import ConfigError, EngineError, SpecAgentError, TaskFileError
from specagent.core.types import Quantization


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="YAML config (see configs/)")
    parser.add_argument("--dump-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="override config values")


def _add_ray_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                        help="run the work on Ray actors (executor.kind=ray; the `ray` extra): alone, a local cluster; "
                             "`auto`, the cluster `ray start` runs here; or ray://HOST:10001")


def _ray_overrides(args: argparse.Namespace) -> list[str]:
    """--ray [ADDRESS] as the config overrides it stands for, before the user's own."""
    address = getattr(args, "ray", None)
    if address is None:
        return []
    if "=" in address:  # `--ray key=value`: argparse took an override for the address (none has a '=')
        args.overrides.insert(0, address)
        address = ""
    return ["executor.kind=ray"] + ([f"executor.address={json.dumps(address)}"] if address else [])


def _config(schema_name: str, args: argparse.Namespace):
    """The validated config of a command, or None after printing it for --dump-config."""
    import specagent.config as config

    overrides = _ray_overrides(args) + list(args.overrides)
    cfg = config.load_config(getattr(config, schema_name), args.config, overrides)
    if args.dump_config:
        print(config.dump_config(cfg), end="")
        return None
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    """Episodes of one mode on one environment: transcript, episodes.jsonl, summary."""
    cfg = _config("RunConfig", args)
    if cfg is None:
        return 0
    from specagent.runtime.run import run_from_config

    run_from_config(cfg)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """A matrix of arms on an environment's tasks: episodes.jsonl, report.json, report.md, plots."""
    cfg = _config("EvalConfig", args)
    if cfg is None:
        return 0
    from specagent.eval.matrix import eval_from_config

    eval_from_config(cfg)
    return 0


def _options(schema_name: str, args: argparse.Namespace, *fields: str):
    """The command's flags as its options schema (config.py), validated."""
    import specagent.config as config

    return config.load_options(getattr(config, schema_name), {f: getattr(args, f) for f in fields}, args.command)


def cmd_report(args: argparse.Namespace) -> int:
    """Regenerate an eval's report files from its episodes.jsonl."""
    from specagent.eval.report import write_report

    write_report(_options("ReportOptions", args, "eval_dir").eval_dir)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Convert existing agent logs (OpenAI JSONL, tau-bench, tau2-bench) to trajectories.jsonl."""
    from specagent.data.importers import import_trajectories

    opts = _options("ImportOptions", args, "inputs", "format", "out", "tools", "source", "model")
    report = import_trajectories(opts.inputs, fmt=opts.format, out=opts.out, tools_yaml=opts.tools,
                                 source=opts.source, model=opts.model)
    print(report.summary())
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    """Run the strong model on an environment's tasks; write trajectories.jsonl."""
    cfg = _config("CollectConfig", args)
    if cfg is None:
        return 0
    from specagent.data.stage import collect_from_config

    collect_from_config(cfg)
    return 0


def cmd_mine(args: argparse.Namespace) -> int:
    """Drafted segments at every cut point of strong trajectories, labeled; HF datasets + card."""
    cfg = _config("MineConfig", args)
    if cfg is None:
        return 0
    from specagent.data.mine import Shard
    from specagent.data.stage import mine_from_config

    try:
        shard = Shard.parse(args.shard)
    except ValueError as err:
        raise ConfigError(f"--shard: {err}") from None
    mine_from_config(cfg, shard, args.merge)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """LoRA-train the weak model's drafter or the strong model's verdict (head or generative)."""
    cfg = _config({"drafter": "DrafterTrainConfig", "verdict": "VerdictTrainConfig"}[args.kind], args)
    if cfg is None:
        return 0
    if args.kind == "drafter":
        from specagent.train.drafter import train_drafter

        train_drafter(cfg)
    else:
        from specagent.train.verdict import train_verdict

        train_verdict(cfg)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """Environment utilities: serve the built-in store domain as an MCP server; list a split's tasks."""
    if args.action == "tasks":
        return _list_tasks(_options("EnvTasksOptions", args, "domain", "split", "user", "per_kind", "as_json"))
    if args.action == "tasks-from-runs":
        return _tasks_from_runs(_options("TasksFromRunsOptions", args, "trajectories", "out", "task_ids",
                                         "min_reward"))
    from specagent.envs.mcp import server

    opts = _options("ServeMcpOptions", args, "domain", "data_dir", "http", "lie")
    mcp_server = server.store_server(opts.lie) if opts.domain == "builtin" else server.airline_server(
        opts.data_dir, opts.lie)
    server.serve(mcp_server, http_port=opts.http)
    return 0


def _tasks_from_runs(opts) -> int:
    from specagent.envs.mcp.from_runs import tasks_from_runs, tasks_text
    from specagent.records.trajectories import atomic_write_text, read_trajectories

    made = tasks_from_runs(read_trajectories(opts.trajectories), opts.task_ids, opts.min_reward)
    if not made.tasks:
        raise ConfigError(f"{opts.trajectories}: no run left to make a task of ({dict(made.left_out)})")
    atomic_write_text(opts.out, tasks_text(made.tasks, jsonl=opts.out.endswith(".jsonl")))
    writes = sum(len(task["gold_actions"]) for task in made.tasks)
    left = ", ".join(f"{n} {why}" for why, n in sorted(made.left_out.items())) or "none"
    print(f"{len(made.tasks)} tasks -> {opts.out} ({writes} gold writes; "
          f"{sum(1 for t in made.tasks if not t['gold_actions'])} tasks expect no write); runs left out: {left}")
    return 0


def _list_tasks(args) -> int:
    """One line per task (id, category, opening request), then the count per category."""
    import collections
    import json

    from specagent.envs.store import StoreEnv

    env = StoreEnv(split=args.split, user=args.user, per_kind=args.per_kind)
    counts: collections.Counter[str] = collections.Counter()
    for task_id in env.task_ids():
        task = env.task(task_id)
        counts[task["category"]] += 1
        row = {"id": task_id, "category": task["category"], "request": task["request"]}
        print(json.dumps(row) if args.as_json else "\t".join(row.values()))
    if not args.as_json:
        print(f"{sum(counts.values())} tasks ({args.split or 'hand-checked'}, user {args.user}): "
              + ", ".join(f"{category} {n}" for category, n in counts.items()))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """The runtime as an HTTP service: episodes, OpenAI-compatible chat completions, metrics."""
    cfg = _config("ServeConfig", args)
    if cfg is None:
        return 0
    try:
        from specagent.serve.server import serve
    except ImportError as err:
        raise SpecAgentError(f"specagent serve needs the serve extra: pip install 'specagent[serve]' ({err})") from None
    serve(cfg)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A training output -> adapter dir (+ merged model), vLLM recipe, model card; gated by a smoke round."""
    from specagent.export import export, transformers_factory, vllm_factory

    opts = _options("ExportOptions", args, "run_dir", "out", "merge", "backend", "skip_smoke", "allow_degenerate",
                    "quantize", "prune_vocab", "max_model_len", "cpu_engine_defaults")
    kwargs = {"enforce_eager": True, "block_size": 32} if opts.cpu_engine_defaults else {}
    factory = vllm_factory(kwargs) if opts.backend == "vllm" else transformers_factory
    export(opts.run_dir, opts.out, merge_model=opts.merge, smoke=not opts.skip_smoke, factory=factory,
           max_model_len=opts.max_model_len, backend=opts.backend, allow_degenerate=opts.allow_degenerate,
           quantize=opts.quantize, prune_vocab=opts.prune_vocab)
    return 0


def _add_export_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a `specagent train drafter|verdict` output dir (has adapter/), "
                                        "or one of its checkpoint-N dirs")
    parser.add_argument("--out", "-o", required=True, help="export dir to write (replaced only if the gate passes)")
    parser.add_argument("--merge", action="store_true", help="also write merged/: base + adapter as one checkpoint")
    parser.add_argument("--backend", choices=["vllm", "transformers"], default="vllm",
                        help="engine that must load the export for the smoke gate (default: vllm)")
    parser.add_argument("--skip-smoke", action="store_true", help="no smoke gate (not recommended)")
    parser.add_argument("--allow-degenerate", action="store_true",
                        help="export a verdict head that accepts or rejects nearly every step (not recommended)")
    parser.add_argument("--quantize", choices=get_args(Quantization),
                        help="a full model (a drafter cut from S): write model/ as int8 W8A8 (compressed-tensors, "
                             "served by vLLM: about half the bytes per token of its linear layers)")
    parser.add_argument("--prune-vocab", action="store_true",
                        help="a drafter (model/, or merged/ with --merge): keep only the tokens of its training "
                             "rows in its embedding, LM head and tokenizer (a CPU decodes it faster)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--cpu-engine-defaults", action=argparse.BooleanOptionalAction, default=True,
                        help="vLLM on CPU: enforce_eager and block_size 32 (turn off on GPU)")


FULL_PIPELINE = "configs/quickstart/full.yaml"


def cmd_quickstart(args: argparse.Namespace) -> int:
    """collect -> mine -> train (strong, drafter, verdict) -> export -> eval on the built-in domain."""
    from specagent.quickstart import run_pipeline

    run_pipeline(FULL_PIPELINE if args.full else args.pipeline, fresh=args.fresh)
    return 0


def _add_quickstart_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", default="configs/quickstart/pipeline.yaml",
                        help="the stages to run (default: configs/quickstart/pipeline.yaml)")
    parser.add_argument("--fresh", action="store_true", help="delete every stage's output first")
    parser.add_argument("--full", action="store_true",
                        help=f"the recipe of the README's lead table ({FULL_PIPELINE}; ~2.6 h on a 2-core CPU with bf16, no AMX)")


def _add_train_args(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind, help_text in (("drafter", "LoRA SFT of the weak model on the mined drafter dataset"),
                            ("verdict", "the strong model's verdict: a boundary head or a generative adapter")):
        _add_config_args(kinds.add_parser(kind, help=help_text, description=help_text))


def _add_mine_args(parser: argparse.ArgumentParser) -> None:
    _add_stage_args(parser)
    parser.add_argument("--shard", default="0/1", help="mine only shard i of N (i/N); default: everything")
    parser.add_argument("--merge", type=int, metavar="N", help="build the datasets from N finished shards")


def _add_stage_args(parser: argparse.ArgumentParser) -> None:
    """collect, mine, eval: a config, and where their work runs."""
    _add_config_args(parser)
    _add_ray_arg(parser)


def _add_report_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("eval_dir", help="the output_dir of a `specagent eval` (holds config.yaml, episodes.jsonl)")


def _add_import_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="log files to import")
    parser.add_argument("--format", "-f", default="auto", choices=["auto", "openai", "tau", "tau2"])
    parser.add_argument("--out", "-o", required=True, help="trajectories.jsonl to write (all or nothing)")
    parser.add_argument("--tools", help="YAML with tool schemas and read_only/write lists (configs/import/)")
    parser.add_argument("--source", help="source name stored in each trajectory")
    parser.add_argument("--model", help="model name stored in each trajectory")


def _add_env_args(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    help_text = "serve an environment's tools as an MCP server (stdio, or streamable HTTP with --http)"
    serve = actions.add_parser("serve-mcp", help=help_text, description=help_text)
    serve.add_argument("domain", choices=["builtin", "airline"],
                       help="builtin: the built-in store domain; airline: tau-bench's airline tools (--data-dir)")
    serve.add_argument("--data-dir", help="airline: the tau-bench airline database (flights.json, users.json, ...)")
    serve.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP at http://127.0.0.1:PORT/mcp")
    serve.add_argument("--lie", action="append", default=[], metavar="TOOL",
                       help="(tests) declare this write tool read-only, to check that a user's write: list wins")
    help_text = ("MCP tasks from a strong model's successful runs: request, followups (the user's later "
                 "messages) and gold_actions (the run's successful writes)")
    runs = actions.add_parser("tasks-from-runs", help=help_text, description=help_text)
    runs.add_argument("trajectories", help="trajectories.jsonl (from `specagent import` or `collect`)")
    runs.add_argument("--out", "-o", required=True, help="tasks file to write: .yaml/.yml, or .jsonl")
    runs.add_argument("--task-ids", nargs="+", help="only the runs of these task ids (an unknown id is an error)")
    runs.add_argument("--min-reward", type=lambda v: None if v == "none" else float(v), default=1.0,
                      help="keep runs with at least this reward, where one is recorded (default 1.0; none: all)")
    help_text = "list an environment's tasks: id, category, opening request; a count per category"
    tasks = actions.add_parser("tasks", help=help_text, description=help_text)
    tasks.add_argument("domain", choices=["store"], help="store: the built-in store domain")
    tasks.add_argument("--split", choices=["train", "calibration", "eval"],
                       help="a generated split (default: the 42 hand-checked tasks)")
    tasks.add_argument("--user", choices=["ticket", "multi_turn"], default="ticket",
                       help="whose opening to show: ticket (default) or multi_turn (identity withheld)")
    tasks.add_argument("--per-kind", type=int, metavar="N",
                       help="with --split: N generated tasks of every kind (more than the split's own: its "
                            "tasks, then each kind's next ones)")
    tasks.add_argument("--json", dest="as_json", action="store_true", help="one JSON object per task and line, no counts")


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str, Callable]] = {
    "quickstart": (cmd_quickstart, "the whole pipeline on the built-in domain: collect, mine, train, export, eval",
                   _add_quickstart_args),
    "run": (cmd_run, "run episodes in a mode (strong|weak|stepwise|specagent) on an environment",
            _add_config_args),
    "eval": (cmd_eval, "run a matrix of arms (strong, weak, stepwise, specagent variants) on an environment "
             "and write the report (json, md, plots)", _add_stage_args),
    "report": (cmd_report, "regenerate an eval's report from its episodes.jsonl", _add_report_args),
    "collect": (cmd_collect, "run a strong model on an environment's tasks and write trajectories.jsonl",
                _add_stage_args),
    "mine": (cmd_mine, "draft segments with the weak model at every cut point of strong runs, label them",
             _add_mine_args),
    "train": (cmd_train, "LoRA-train the drafter (weak model) or the verdict head/adapter (strong model) "
              "on mined datasets", _add_train_args),
    "export": (cmd_export, "export a trained adapter for serving (adapter, merged model, vLLM recipe, model card) "
               "behind a smoke gate that loads it in vLLM", _add_export_args),
    "import": (cmd_import, "import agent logs (OpenAI chat JSONL, tau-bench, tau2-bench) as trajectories.jsonl",
               _add_import_args),
    "env": (cmd_env, "environment utilities: serve a built-in domain as an MCP server, list its tasks, make MCP "
            "tasks from runs",
            _add_env_args),
    "serve": (cmd_serve, "serve the runtime over HTTP: episodes, OpenAI-compatible chat completions, metrics",
              _add_config_args),
}


def quiet_engines(verbose: bool) -> None:
    """Engine libraries log every load and kernel choice (a mining run printed ~100 lines before
    its summary). Unless --verbose, they print errors only; a level the user set in the
    environment wins. Set before the engines are imported, so vLLM's engine process inherits it."""
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specagent",
        description="Trajectory-level speculation for tool-using agents: a weak model drafts, "
        "a strong model reviews.",
    )
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="keep the engines' own INFO logs (vLLM, transformers); by default only their errors "
                             "print, so a command's progress and summary stay readable")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text, add_args) in COMMANDS.items():
        add_args(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_engines(args.verbose)
    handler = COMMANDS[args.command][0]
    try:
        return handler(args)
    except (ConfigError, TaskFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except EngineError as err:
        print(f"error: engine failed: {err}", file=sys.stderr)
        print("episodes finished so far are kept; rerun the same command to resume.", file=sys.stderr)
        return 1
    except SpecAgentError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume.", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `specagent env tasks ... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
