"""`rlvr` command line: train, sft, eval, config.

Every user mistake is a `ConfigError`: printed as one line (`error: ...`), exit code 2.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

from rlvr.cli_preference import register as register_preference_commands
from rlvr.cli_runs import register as register_run_commands
from rlvr.errors import ConfigError
from rlvr.safe_io import unpickling_message, write_error, write_error_message
from rlvr.tracking.lock import DirLock
from rlvr.tracking.run_dir import check_output_path


def cmd_train(args) -> int:
    from rlvr.api import Trainer

    recipe, overrides = _split(args.args)
    if args.resume and not (Path(args.resume) / "config.yaml").is_file():
        raise ConfigError(f"--resume: '{args.resume}' is not a run directory (no config.yaml)")
    if args.allow_config_change and not args.resume:
        raise ConfigError("--allow-config-change: only applies with --resume RUN_DIR")
    if args.trust_pickle and not args.resume:
        raise ConfigError("--trust-pickle: only applies with --resume RUN_DIR")
    if args.resume and (kind := _preference_kind(args.resume)):
        raise ConfigError(f"--resume: '{args.resume}' is a `rlvr {kind}` run, which `rlvr train --resume` cannot "
                          f"continue; start a new `rlvr {kind}` run")
    Trainer(config=recipe, overrides=overrides, resume=args.resume or False,
            allow_config_change=args.allow_config_change, trust_pickle=args.trust_pickle, command=sys.argv).train()
    return 0


def _preference_kind(run: str | Path) -> str | None:
    """`rm` or `dpo` when `run` is a run of those commands (its run.json says so), else None."""
    from rlvr.tracking.run_files import read_manifest

    try:
        kind = read_manifest(Path(run)).get("trainer")
    except ConfigError:  # damage: the command that reads the run names it, once
        return None
    return kind if kind in ("rm", "dpo") else None


def cmd_sft(args) -> int:
    from rlvr.config import load_config
    from rlvr.runtime.process import configure_process
    from rlvr.sft.supervised import sft

    recipe, overrides = _split(args.args)
    config = load_config(recipe, overrides)
    check_output_path(args.out, "--out", replaces=args.overwrite)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = DirLock(out.parent / f".{out.name}.lock")  # one sft writes (and replaces) a folder at a time
    lock.acquire(f"--out '{args.out}'")
    try:
        configure_process(threads=config.trainer.threads, thread_mode="ops", model_kind=config.model.kind)
        sft(config, args.out, overwrite=args.overwrite)
    finally:
        lock.release()
    print(f"saved warm start to {args.out}")
    return 0


def cmd_eval(args) -> int:
    import random

    if args.n < 0:
        raise ConfigError(f"--n: must be >= 0 (0 = the whole held-out set, or 200 train problems), got {args.n}")
    from rlvr.agents.task import is_agent_task
    from rlvr.builder.build import build_engine, build_model, build_task
    from rlvr.config import load_config
    from rlvr.tracking.resumable import python_objects
    from rlvr.tracking.run_files import read_config
    from rlvr.trainer.checkpoint import latest_checkpoint
    from rlvr.trainer.evaluate import greedy_accuracy

    run = Path(args.run)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"eval: '{run}' is not a run directory (no config.yaml)")
    if passed := python_objects(run, tolerant=True):  # its config names the default task, not its data
        raise ConfigError(f"eval: '{run}' trained on a {passed.replace('_', ' ')} passed from Python, "
                          f"which `rlvr eval` cannot rebuild; its held-out accuracy is eval/heldout_accuracy "
                          f"in metrics.jsonl")
    if _preference_kind(run) == "rm":
        raise ConfigError(f"eval: '{run}' is a reward model (`rlvr rm`): it scores completions, it writes none; "
                          f"export it (rlvr export RUN DIR) and name DIR in reward.fn to train with it")
    checkpoint = latest_checkpoint(run / "checkpoints")
    if checkpoint is None:
        raise ConfigError(f"eval: '{run}' has no checkpoint yet; train longer or lower trainer.save_every")
    if (checkpoint / "adapter_config.json").is_file():  # LoRA: the run's base plus the checkpoint's adapter
        from rlvr.models.lora import load_adapter

        config = load_config(read_config(run))
        model, tokenizer = build_model(config)
        load_adapter(model, checkpoint)
    else:
        config = load_config(read_config(run), [f"model.path={checkpoint}"])
        model, tokenizer = build_model(config)
    task = build_task(config, tokenizer)

    examples = task.heldout() if args.split == "heldout" else task.sample(args.n, random.Random(args.seed))
    examples = examples[: args.n] if args.n else examples
    engine = build_engine(config, model, tokenizer)
    accuracy = greedy_accuracy(engine, tokenizer, task, examples, agent=is_agent_task(task))
    print(f"{checkpoint.name}: greedy {args.split} accuracy {accuracy:.3f} on {len(examples)} problems")
    return 0


def cmd_config(args) -> int:
    from rlvr.config import dump_yaml, load_config, load_with_sources

    if args.from_trl:
        from rlvr.config.from_trl import recipe_from_trl

        if args.args or args.explain:
            raise ConfigError("--from-trl: takes the TRL file alone; apply overrides to the recipe it prints")
        print(recipe_from_trl(args.from_trl), end="")
        return 0
    if args.from_verl:
        from rlvr.config.from_verl import recipe_from_verl

        if args.args or args.explain:
            raise ConfigError("--from-verl: takes the verl file alone; apply overrides to the recipe it prints")
        print(recipe_from_verl(args.from_verl), end="")
        return 0
    recipe, overrides = _split(args.args)
    if args.explain:
        from rlvr.config.binding import explain, table

        config, sources = load_with_sources(recipe, overrides)
        print(table(explain(config, sources)), end="")
    else:
        print(dump_yaml(load_config(recipe, overrides)), end="")
    return 0


def cmd_recipes(args) -> int:
    from rlvr.config.recipes import packaged_recipes, summary

    recipes = packaged_recipes()
    width = max(map(len, recipes), default=0)
    for name, path in recipes.items():
        print(f"{name:<{width}}  {summary(path)}")
    return 0


def _split(items: list[str]) -> tuple[str | None, list[str]]:
    """First positional may be a recipe file; the rest are KEY=VALUE overrides. A first item
    without `=` that is no file but reads as a config key is an override missing its value."""
    if items and "=" not in items[0]:
        first = items[0]
        if not Path(first).exists() and not first.endswith((".yaml", ".yml")):
            from rlvr.config import all_keys

            if first in all_keys() or "." in first and not {"/", "\\"} & set(first):
                raise ConfigError(f"override '{first}': expected KEY=VALUE, e.g. {first}=VALUE "
                                  f"(a recipe is a .yaml file)")
        return first, items[1:]
    return None, items


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlvr", description="RL with verifiable rewards, from a laptop CPU up.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="RL-train a policy (default: tiny model on Countdown)")
    t.add_argument("args", nargs="*", help="[RECIPE.yaml or packaged recipe name] [key.sub=value ...]")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    t.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept a config that differs from the run's (recorded in run.json)")
    t.add_argument("--trust-pickle", action="store_true",
                   help="with --resume: load the checkpoint's pickled files with the full pickle, which runs any "
                        "code they name (only for a run folder you made, e.g. with an older rlvr, or trust)")
    t.set_defaults(fn=cmd_train)
    s = sub.add_parser("sft", help="supervised warm start on procedural solutions")
    s.add_argument("args", nargs="*", help="[RECIPE.yaml] [key.sub=value ...]")
    s.add_argument("--out", required=True, help="directory for the Hugging Face checkpoint")
    s.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder that rlvr sft made")
    s.set_defaults(fn=cmd_sft)
    e = sub.add_parser("eval", help="greedy accuracy of a run's newest checkpoint")
    e.add_argument("run", help="run directory")
    e.add_argument("--split", choices=["heldout", "train"], default="heldout")
    e.add_argument("--n", type=int, default=0, help="number of problems (0 = whole held-out set / 200 train)")
    e.add_argument("--seed", type=int, default=0, help="seed for the train split sample")
    e.set_defaults(fn=cmd_eval)
    c = sub.add_parser("config", help="print the resolved config")
    c.add_argument("args", nargs="*", help="[RECIPE.yaml] [key.sub=value ...]")
    c.add_argument("--from-trl", metavar="FILE",
                   help="print an rlvr recipe for TRL's GRPOConfig arguments (JSON/YAML, or '--flag value' text)")
    c.add_argument("--from-verl", metavar="FILE",
                   help="print an rlvr recipe for a verl config (its YAML, or a run script's key=value overrides)")
    c.add_argument("--explain", action="store_true",
                   help="instead: each chosen entry's keywords, the field that feeds each, its value and source")
    c.set_defaults(fn=cmd_config)
    r = sub.add_parser("recipes", help="list the packaged recipes (`rlvr train NAME` runs one)")
    r.set_defaults(fn=cmd_recipes)
    register_run_commands(sub)
    register_preference_commands(sub, _split)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options and KEY=VALUE overrides in any order (`rlvr sft model.path= --out DIR sft.steps=300`):
    what argparse leaves over after the options is appended to the command's positional list."""
    p = parser()
    args, extra = p.parse_known_args(argv)
    unknown = [item for item in extra if item.startswith("-") or not hasattr(args, "args")]
    if unknown:
        hint = _flag_hint(sys.argv[1:] if argv is None else argv) if hasattr(args, "args") else ""
        p.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    if extra:
        args.args = [*args.args, *extra]
    return args


def _flag_hint(argv: list[str]) -> str:
    """For `--num_generations 4` (a TRL launch flag, or an rlvr key written as a flag): the
    override that means it, `num_generations=4`."""
    from rlvr.config import all_keys
    from rlvr.config.trl_names import TRL_NAMES

    for i, item in enumerate(argv):
        name, eq, value = item[2:].partition("=") if item.startswith("--") else ("", "", "")
        name = name.replace("-", "_") if name.replace("-", "_") in TRL_NAMES else name
        if name in TRL_NAMES or name in all_keys():
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                value = argv[i + 1]
            return f"; overrides are KEY=VALUE without dashes: write {name}={value or 'VALUE'}"
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars drown our own lines
    if args.command == "eval" and args.split == "train" and not args.n:
        args.n = 200
    try:
        return args.fn(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except pickle.UnpicklingError as err:  # a model folder's pickled weights naming code (a weights-only load)
        print(f"error: {unpickling_message(err, 'a weights file')}", file=sys.stderr)
        return 2
    except OSError as err:  # a read-only or full disk: one line naming the path and the free space
        if not write_error(err):
            raise
        print(f"error: {write_error_message(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM/SIGINT during training (RunInterrupted)
        print(f"interrupted: {err}" if str(err) else "interrupted", file=sys.stderr)
        return getattr(err, "exit_status", 130)


if __name__ == "__main__":
    sys.exit(main())
