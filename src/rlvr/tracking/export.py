"""`rlvr export RUN DIR`: a run's checkpoint as a plain Hugging Face model directory.

The directory holds weights (safetensors), config, generation config and tokenizer, loadable
with `AutoModelForCausalLM` (a reward model from `rlvr rm`: `AutoModelForSequenceClassification`) /
`AutoTokenizer` and nothing from rlvr; trainer state (optimizer,
RNG) is left behind. It is written to a temp folder beside DIR, reloaded and checked (same
weights), then renamed into place, so DIR only ever appears complete.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import ConfigError
from rlvr.tracking.run_dir import check_output_path

PROVENANCE_FILE = "rlvr_export.json"


@dataclass
class Exported:
    path: Path
    checkpoint: Path
    verified: bool


def find_checkpoint(run: Path, step: int | None = None) -> Path:
    """The newest complete checkpoint of `run` (or the one at `step`), with a one-line error if none."""
    directory = run / "checkpoints"
    candidates = directory.glob("step_*") if directory.is_dir() else []
    # A LoRA run's checkpoints hold the adapter (adapter_config.json) instead of a whole model.
    complete = sorted(p for p in candidates if (p / "config.json").is_file() or (p / "adapter_config.json").is_file())
    if step is not None:
        wanted = directory / f"step_{step:06d}"
        if wanted not in complete:
            shown = ", ".join(p.name for p in complete) or "none"
            raise ConfigError(f"export: '{run}' has no checkpoint at step {step}; available: {shown}")
        return wanted
    if not complete:
        raise ConfigError(f"export: '{run}' has no complete checkpoint; train longer or lower trainer.save_every")
    return complete[-1]


def _same_weights(a, b) -> bool:
    import torch

    left, right = a.state_dict(), b.state_dict()
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def _merged_adapter(run: Path, checkpoint: Path):
    """A LoRA checkpoint as a plain model: the run's base, rebuilt as the run loaded it (`model.*`
    of its config.yaml), with the checkpoint's adapter merged into its weights."""
    from rlvr.config import load_config
    from rlvr.models.causal_lm import load_causal_lm
    from rlvr.models.lora import merged

    config = load_config(run / "config.yaml")
    m = config.model
    base, _ = load_causal_lm(m.path, seed=config.seed, dtype=m.dtype,
                             hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                             intermediate_size=m.intermediate_size, max_seq_len=m.max_seq_len)
    return merged(base, checkpoint)


def _auto_class(checkpoint: Path):
    """The `transformers` auto class of a checkpoint: a sequence classifier's, else a causal LM's."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    try:
        heads = json.loads((checkpoint / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError):
        heads = []
    classifier = any(h.endswith("ForSequenceClassification") for h in heads)
    return AutoModelForSequenceClassification if classifier else AutoModelForCausalLM


def export_run(run: str | Path, out: str | Path, *, step: int | None = None, force: bool = False) -> Exported:
    from transformers import AutoTokenizer

    run, out = Path(run), Path(out)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"export: '{run}' is not a run directory (no config.yaml)")
    check_output_path(out, "export", reads=[run], replaces=force)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ConfigError(f"export: '{out}' exists and is not empty; choose a new directory or pass --force")
    checkpoint = find_checkpoint(run, step)
    auto = _auto_class(checkpoint)
    try:
        # dtype "auto": the checkpoint's own (a bf16 run exports bf16 weights, not an fp32 upcast).
        model = (_merged_adapter(run, checkpoint) if (checkpoint / "adapter_config.json").is_file()
                 else auto.from_pretrained(checkpoint, dtype="auto"))
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    except (OSError, ValueError) as err:
        raise ConfigError(f"export: checkpoint '{checkpoint}' is unreadable ({type(err).__name__}); "
                          "pass --step to export an earlier one") from None

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
        provenance = {"run": str(run.resolve()), "checkpoint": checkpoint.name, "git_sha": manifest.get("git_sha"),
                      "seed": manifest.get("seed"), "rlvr": (manifest.get("packages") or {}).get("rlvr")}
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        reloaded = auto.from_pretrained(tmp, dtype="auto")
        AutoTokenizer.from_pretrained(tmp)
        if not _same_weights(model, reloaded):
            raise RuntimeError(f"export: reloaded weights in {tmp} differ from {checkpoint}")
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Exported(path=out, checkpoint=checkpoint, verified=True)
