"""`rlvr dpo` and `rlvr rm`: preference training in a run directory, as `rlvr train` makes one.

`cli.py` calls `register(sub, split)` once (`split`: its RECIPE / KEY=VALUE reader); each handler
takes the parsed args and returns an exit code, raising `ConfigError` for user mistakes (printed as one line, exit 2).
"""

from __future__ import annotations

import sys


def _run(args, kind: str, split) -> int:
    from rlvr.config import load_config
    from rlvr.runtime.process import configure_process

    recipe, overrides = split(args.args)
    config = load_config(recipe, overrides)
    configure_process(threads=config.trainer.threads, thread_mode="ops", model_kind=config.model.kind)
    if kind == "dpo":
        from rlvr.preference.dpo import dpo as trainer
    elif config.preference.process:
        from rlvr.preference.process import train_process_reward_model as trainer
    else:
        from rlvr.preference.reward_model import train_reward_model as trainer
    final = trainer(config, command=sys.argv)
    shown = " ".join(f"{k}={v:.3f}" for k, v in final.items() if k.startswith("eval/"))
    print(f"done: step {final.get('step')} {shown}")
    return 0


def register(sub, split) -> None:
    d = sub.add_parser("dpo", help="DPO / IPO on preference pairs (preference.*; default: pairs from the verifier)")
    d.add_argument("args", nargs="*", help="[RECIPE.yaml] [key.sub=value ...]")
    d.set_defaults(fn=lambda args: _run(args, "dpo", split))
    r = sub.add_parser("rm", help="train a Bradley-Terry reward model on preference pairs (preference.*)")
    r.add_argument("args", nargs="*", help="[RECIPE.yaml] [key.sub=value ...]")
    r.set_defaults(fn=lambda args: _run(args, "rm", split))
