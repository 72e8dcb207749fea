"""Regenerate the packaged tiny vision-language warm start, `rlvr:shapes-vlm-warmstart`.

    python bench/vlm_warmstart.py [--out src/rlvr/assets/shapes-vlm-warmstart] [--steps 150]

Builds the tiny Idefics3 in code (`rlvr.models.vlm.tiny_vlm`, seed 0), saves it with its
processor, then runs rlvr's own supervised warm start (`rlvr sft`) on `count_shapes` from it:
the loss on the answer tokens only, stopped early so RL starts from a policy that is sometimes
right. The vision tower stays frozen at its random initialisation (random features keep the
picture's information; trained from scratch at this learning rate it collapsed to a constant, and
the model answered every picture with the answer prior). Prints the warm start's greedy
held-out accuracy.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rlvr.config import load_config
from rlvr.models.vlm import tiny_vlm
from rlvr.sft.supervised import sft

ASSET = Path(__file__).resolve().parent.parent / "src" / "rlvr" / "assets" / "shapes-vlm-warmstart"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ASSET))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--colours", type=int, default=3, help="task.count_shapes.colours")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base:
        model, processor = tiny_vlm(seed=0)
        model.save_pretrained(base)
        processor.save_pretrained(base)
        config = load_config(None, [f"model.path={base}", "task.name=count_shapes", "task.heldout_size=200",
                                    f"task.count_shapes.colours={args.colours}",
                                    f"sft.steps={args.steps}", "sft.batch_size=32", f"sft.lr={args.lr}",
                                    "sft.warmup_steps=10", "rollout.max_new_tokens=3", "trainer.threads=1"])
        result = sft(config, args.out, overwrite=True)
    recorded = Path(args.out) / "sft_config.yaml"  # the base was a temporary folder: say what it was
    recorded.write_text("# model.path: rlvr.models.vlm.tiny_vlm(seed=0), built by bench/vlm_warmstart.py\n"
                        + recorded.read_text().replace(f"path: {base}", "path: ''"))
    print(f"warm start at {args.out}: greedy held-out accuracy {result['heldout_accuracy']:.3f}")


if __name__ == "__main__":
    main()
