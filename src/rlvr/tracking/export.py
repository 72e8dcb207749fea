"""`rlvr export RUN DIR`: a run's checkpoint as a plain Hugging Face model directory.

The directory holds weights (safetensors), config, generation config and tokenizer, loadable
with `AutoModelForCausalLM` (a reward model from `rlvr rm`: `AutoModelForSequenceClassification`) /
`AutoTokenizer` and nothing from rlvr; trainer state (optimizer,
RNG) is left behind. It is written to a temp folder beside DIR, reloaded and checked (same
weights), then renamed into place, so DIR only ever appears complete. It holds a `.rlvr-made`
marker: `--force` replaces only a folder with one (an export rlvr made), never a user's folder,
the working folder or one above the run.

A LoRA run's checkpoint holds the adapter. `--adapter` writes it as it is (PEFT's format:
`adapter_config.json`, `adapter_model.safetensors`, with the tokenizer), for
`PeftModel.from_pretrained(base, DIR)`; its `base_model_name_or_path` is portable (`portable_base`:
a Hub id, or the base folder relative to DIR), never an absolute path of this machine. Without
`--adapter` the adapter is merged into the base in float32 and the result cast to `--dtype` (`auto`:
the run's own); a cast that rounds away part of the update is refused (`merge_refusal`), naming
`--dtype float32` and `--adapter`: more than `MAX_LOST_SHARE` of the weights the adapter changes
cast back to their base value (a change below half of bfloat16's spacing at that weight), or
`update_error` (||cast(W + dW) - cast(W) - dW|| / ||dW|| over those weights) above
`MAX_UPDATE_ERROR`. A short low-learning-rate LoRA run's update is mostly below bfloat16's
resolution (measured: two steps at lr 1e-4 lose 35% of it).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import ConfigError, RunInterrupted
from rlvr.safe_io import (
    kind_of,
    mark_made,
    removable_folder,
    remove_made_folder,
    temp_folder_for,
    unpickling_message,
)
from rlvr.tracking.run_dir import check_output_path
from rlvr.tracking.run_files import checkpoint_dirs, read_config, read_manifest

PROVENANCE_FILE = "rlvr_export.json"
MAX_LOST_SHARE = 0.1  # a merged export whose cast returns more of the changed weights to the base is refused
MAX_UPDATE_ERROR = 0.1  # and one whose cast changes the adapter's update by more (relative L2)
DTYPES = ("auto", "float32", "bfloat16")


@dataclass
class Exported:
    path: Path
    checkpoint: Path
    verified: bool
    merge: dict | None = None  # a merged adapter: {"dtype", "changed", "lost", "update_error"}


def update_error(original: dict, merged: dict, dtype) -> dict:
    """How much of the merge's update `merged - original` (float32 state dicts) survives a cast to
    `dtype`: entries the merge changed, entries the cast returns to the original value, and the
    relative L2 error of the cast update. Hand check: original 1.0, update 1e-3 in bfloat16 (spacing
    2^-7 near 1): the cast update is 0, one entry lost, error 1.0; update 0.25 survives exactly."""
    import torch

    changed = lost = 0
    err2 = norm2 = 0.0
    for key, after in merged.items():
        before = original.get(key)
        if before is None or not after.is_floating_point():
            continue
        delta = after.float() - before.float()
        cast = after.to(dtype).float() - before.to(dtype).float()
        moved = delta != 0
        changed += int(moved.sum())
        lost += int((moved & (cast == 0)).sum())
        err2 += float(torch.sum((cast - delta) ** 2))
        norm2 += float(torch.sum(delta ** 2))
    error = (err2 / norm2) ** 0.5 if norm2 else 0.0
    return {"dtype": str(dtype).removeprefix("torch."), "changed": changed, "lost": lost, "update_error": error}


def merge_refusal(record: dict) -> str | None:
    """Why a merge record's cast loses too much of the update (one line with the fix), or None.

    >>> merge_refusal({"dtype": "bfloat16", "changed": 4096, "lost": 1442, "update_error": 0.38})[:74]
    'export: casting the float32 merge to bfloat16 rounds away 1442 of the 4096'
    >>> merge_refusal({"dtype": "bfloat16", "changed": 4096, "lost": 121, "update_error": 0.04}) is None
    True
    """
    share = record["lost"] / record["changed"] if record["changed"] else 0.0
    if share <= MAX_LOST_SHARE and record["update_error"] <= MAX_UPDATE_ERROR:
        return None
    return (f"export: casting the float32 merge to {record['dtype']} rounds away {record['lost']} of the "
            f"{record['changed']} weights the adapter changes ({share:.0%}; update error "
            f"{record['update_error']:.2f}; at most {MAX_LOST_SHARE:.0%} and {MAX_UPDATE_ERROR:.2f} pass); export with "
            f"--dtype float32, or the adapter alone with --adapter")


def find_checkpoint(run: Path, step: int | None = None) -> Path:
    """The newest complete checkpoint of `run` (or the one at `step`), with a one-line error if none."""
    directory = run / "checkpoints"
    candidates = checkpoint_dirs(directory)
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


def _base(run: Path):
    """The run's base model, rebuilt as the run loaded it (`model.*` of its config.yaml)."""
    from rlvr.config import load_config
    from rlvr.models.causal_lm import load_causal_lm, resolve_model_path
    from rlvr.models.vlm import is_vlm_dir, load_vlm

    config = load_config(read_config(run))
    m = config.model
    if m.path and is_vlm_dir(resolve_model_path(m.path)):
        return load_vlm(m.path, resolve_model_path(m.path), dtype=m.dtype)[0]
    base, _ = load_causal_lm(m.path, seed=config.seed, dtype=m.dtype,
                             hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                             intermediate_size=m.intermediate_size, max_seq_len=m.max_seq_len)
    return base


def _auto_class(checkpoint: Path):
    """The `transformers` auto class of a checkpoint: a sequence classifier's, an image-text-to-text
    model's (a `vision_config`), else a causal LM's."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    try:
        config = json.loads((checkpoint / "config.json").read_text())
        heads = config.get("architectures") or []
    except (OSError, ValueError, AttributeError):
        config, heads = {}, []
    if "vision_config" in config:
        return AutoModelForImageTextToText
    classifier = any(h.endswith("ForSequenceClassification") for h in heads)
    return AutoModelForSequenceClassification if classifier else AutoModelForCausalLM


def _load_tokenizer(checkpoint: Path):
    """The checkpoint's tokenizer, or its processor (tokenizer and image processor) when it has one."""
    from transformers import AutoProcessor, AutoTokenizer

    loader = AutoProcessor if (checkpoint / "processor_config.json").is_file() else AutoTokenizer
    return loader.from_pretrained(checkpoint)


def _merged_adapter(run: Path, checkpoint: Path, dtype: str):
    """A LoRA checkpoint as a plain model: the base with the adapter merged in float32, cast to
    `dtype` (auto: the base's own), refused when the cast loses the update; and the merge's record."""
    import torch

    from rlvr.models.lora import merged

    base = _base(run)
    target = getattr(torch, dtype) if dtype != "auto" else next(base.parameters()).dtype
    base = base.to(torch.float32)  # exact for a bfloat16 base: every bfloat16 is a float32
    original = {k: v.detach().clone() for k, v in base.state_dict().items()}
    model = merged(base, checkpoint)
    record = update_error(original, model.state_dict(), target)
    refusal = merge_refusal(record)
    if refusal:
        raise ConfigError(refusal)
    return model.to(target), record


def portable_base(model_path: str, out: Path) -> tuple[str | None, str | None]:
    """(`base_model_name_or_path`, `revision`) an exported adapter records, so it loads after a move:
    a Hub id as written (PEFT's `AutoPeftModelForCausalLM` fetches it from anywhere), a local base
    folder as its path relative to the adapter folder (the two move together; load the base from
    `DIR / base_model_name_or_path`), None for a model built from a config (no folder to name)."""
    from rlvr.hub import HUB_ID
    from rlvr.models.causal_lm import resolve_model_path

    if not model_path:
        return None, None
    if not Path(model_path).exists() and HUB_ID.fullmatch(model_path):
        repo, _, revision = model_path.partition("@")
        return repo, revision or None
    base = resolve_model_path(model_path).resolve()
    return os.path.relpath(base, out.resolve()), None


def _copy_adapter(run: Path, checkpoint: Path, tmp: Path, out: Path) -> None:
    """The checkpoint's adapter into `tmp`, its config naming the base portably (`portable_base`)."""
    from rlvr.config import load_config
    from rlvr.models.lora import ADAPTER_WEIGHTS

    shutil.copyfile(checkpoint / ADAPTER_WEIGHTS, tmp / ADAPTER_WEIGHTS)
    config = json.loads((checkpoint / "adapter_config.json").read_text())
    base, revision = portable_base(load_config(read_config(run)).model.path, out)
    config.update(base_model_name_or_path=base, revision=revision)
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def export_run(run: str | Path, out: str | Path, *, step: int | None = None, force: bool = False,
               adapter: bool = False, dtype: str = "auto") -> Exported:
    run, out = Path(run), Path(out)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"export: '{run}' is not a run directory (no config.yaml)")
    if dtype not in DTYPES:
        raise ConfigError(f"export: --dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    check_output_path(out, "export", reads=[run], replaces=force)
    if kind_of(out) not in (None, "a directory") or out.exists() and not out.is_dir():
        raise ConfigError(f"export: '{out}' is {kind_of(out) or 'a file'}; choose a new directory")
    if force:  # before any work: --force replaces only a folder rlvr made
        removable_folder(out, "export --force", reads=[run])
    elif out.exists() and any(out.iterdir()):
        raise ConfigError(f"export: '{out}' exists and is not empty; choose a new directory, or pass --force to "
                          f"replace an export rlvr made")
    checkpoint = find_checkpoint(run, step)
    lora = (checkpoint / "adapter_config.json").is_file()
    if adapter and not lora:
        raise ConfigError(f"export --adapter: '{run}' trained no adapter (model.lora.r=0); export the whole "
                          f"model without --adapter")
    if adapter and dtype != "auto":
        raise ConfigError("export: --dtype applies to the merged model; the adapter is written as it was saved")
    record, auto = None, _auto_class(checkpoint)
    try:
        tokenizer = _load_tokenizer(checkpoint)
        if adapter:
            model = None
        elif lora:
            model, record = _merged_adapter(run, checkpoint, dtype)
        else:  # dtype "auto": the checkpoint's own (a bf16 run exports bf16 weights, not an fp32 upcast)
            model = auto.from_pretrained(checkpoint, dtype=dtype)
    except pickle.UnpicklingError as err:  # a `.bin` whose pickle names code: transformers loads weights only
        raise ConfigError(f"export: {unpickling_message(err, f'checkpoint {str(checkpoint)!r}')}") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"export: checkpoint '{checkpoint}' is unreadable ({type(err).__name__}); "
                          "pass --step to export an earlier one") from None

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_folder_for(out)
    with _term_raises():  # a SIGTERM unwinds through the `finally` below: no temp folder is left
        _write(run, out, tmp, checkpoint, model, tokenizer, auto, adapter=adapter, lora=lora, record=record,
               force=force)
    return Exported(path=out, checkpoint=checkpoint, verified=True, merge=record)


@contextlib.contextmanager
def _term_raises():
    """SIGTERM raises `RunInterrupted` (exit 143) here instead of ending the process at once, so
    cleanup runs; in the main thread only, where Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupted(signum, frame):
        raise RunInterrupted("SIGTERM", 128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write(run: Path, out: Path, tmp: Path, checkpoint: Path, model, tokenizer, auto, *, adapter: bool, lora: bool,
           record, force: bool) -> None:
    """Write the export into `tmp`, check that it reloads, then rename it to `out`; `tmp` is removed either way."""
    from rlvr.models.lora import ADAPTER_WEIGHTS, peft_loads

    try:
        _copy_adapter(run, checkpoint, tmp, out) if adapter else model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest = read_manifest(run, tolerant=True)
        packages = manifest.get("packages") if isinstance(manifest.get("packages"), dict) else {}
        provenance = {"run": str(run.resolve()), "checkpoint": checkpoint.name, "git_sha": manifest.get("git_sha"),
                      "seed": manifest.get("seed"), "rlvr": packages.get("rlvr"),
                      "form": "adapter" if adapter else "merged" if lora else "model", "merge": record}
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        mark_made(tmp, "export")
        _load_tokenizer(tmp)
        same = (peft_loads(_base(run), tmp, checkpoint / ADAPTER_WEIGHTS) if adapter
                else _same_weights(model, _auto_class(tmp).from_pretrained(tmp, dtype="auto")))
        if not same:
            raise RuntimeError(f"export: reloaded weights in {tmp} differ from {checkpoint}")
        if not force and out.exists() and any(out.iterdir()):  # another export to it finished meanwhile
            raise ConfigError(f"export: '{out}' was written by another command while this export ran; this one is "
                              f"discarded: choose a new directory, or pass --force to replace that one")
        remove_made_folder(out, "export --force", reads=[run])  # checked again: it may have changed meanwhile
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
