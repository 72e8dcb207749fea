"""LoRA adapters through `peft` (the `lora` extra), the one module that imports it.

`apply_lora` wraps a causal LM so only the adapters train; `AdapterDisabled` is the KL reference
under LoRA (the same module with the adapter switched off, so no second copy of the weights);
`load_adapter` restores a checkpoint's adapter and `merged` folds a saved adapter into a base
for export. A peft-wrapped model is not a plain Llama to `kernels.weights.supports`, so it
always runs the plain `transformers` forward: the fused path reads the base weights directly
and would skip the adapters.
"""

from __future__ import annotations

import threading
from pathlib import Path

from rlvr.errors import ConfigError
from rlvr.model_files import check_weights, read_json

ADAPTER_WEIGHTS = "adapter_model.safetensors"
DAMAGED = "the checkpoint is damaged: use an earlier one (export --step N), or restore the folder from a copy"


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora.r: LoRA needs peft; install it with pip install 'rlvr[lora]' "
                          "or set model.lora.r=0") from None
    return peft


def apply_lora(model, *, r: int, alpha: float, dropout: float, target_modules):
    """`model` wrapped by `peft.get_peft_model`: base weights frozen, rank-`r` adapters on `target_modules`."""
    peft = _peft()
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                             task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, config)
    except ValueError as err:
        reason = str(err).strip().splitlines()[0][:160]
        raise ConfigError(f"model.lora.target_modules: {targets!r} matches no module of {type(model).__name__} "
                          f"({reason}); name its linear layers (e.g. [q_proj, v_proj]) or use all-linear") from None


class AdapterDisabled:
    """A policy's log-probs with its adapter switched off: the base model, the KL reference.

    Switching is counted so that row workers calling at once share one switch-off; the policy
    itself is never called while a reference call is in flight (the loop runs them in turn)."""

    def __init__(self, policy):
        self.policy = policy
        self._lock = threading.Lock()
        self._users = 0
        self._context = None

    @property
    def forwards(self) -> int:
        return self.policy.forwards

    @property
    def exact_logprobs(self) -> bool:
        return self.policy.exact_logprobs

    def parameters(self):
        return iter(())

    def begin_step(self, seed: int) -> None:
        self.policy.begin_step(seed)

    def _enter(self) -> None:
        with self._lock:
            if self._users == 0:
                self._context = self.policy.model.disable_adapter()
                self._context.__enter__()
            self._users += 1

    def _exit(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._context.__exit__(None, None, None)
                self._context = None

    def batch_logprobs(self, batch, *, with_entropy: bool = False):
        self._enter()
        try:
            return self.policy.batch_logprobs(batch, with_entropy=with_entropy)
        finally:
            self._exit()

    def batch_token_stats(self, batch, *, with_entropy: bool = False, stats: tuple[str, ...] = ()):
        self._enter()
        try:
            return self.policy.batch_token_stats(batch, with_entropy=with_entropy, stats=stats)
        finally:
            self._exit()

    def token_logprobs(self, *args, **kwargs):
        self._enter()
        try:
            return self.policy.token_logprobs(*args, **kwargs)
        finally:
            self._exit()


def load_adapter(model, directory: Path) -> None:
    """Load the adapter weights saved in `directory` into the peft-wrapped `model` (the base is untouched),
    checked first: a folder without readable weights, or weights of other names or shapes than `model`'s
    adapters (another base, rank or target modules), is one line, not a loader's traceback."""
    peft = _peft()
    from safetensors.torch import load_file

    directory = Path(directory)
    read_json(directory / "adapter_config.json", "checkpoint", DAMAGED)
    check_weights(directory, "checkpoint", DAMAGED, names=(ADAPTER_WEIGHTS,))
    saved = load_file(str(directory / ADAPTER_WEIGHTS))
    own = {k: tuple(v.shape) for k, v in peft.get_peft_model_state_dict(model).items()}
    other = sorted(set(saved) ^ set(own)) or [k for k in sorted(saved) if tuple(saved[k].shape) != own[k]]
    if other:
        name = other[0]
        shapes = f" ({tuple(saved[name].shape)} saved, {own[name]} here)" if name in saved and name in own else ""
        raise ConfigError(f"checkpoint '{directory}': adapter weights do not fit this model ({name}{shapes}, ...); "
                          f"the adapter was trained on another base or with other model.lora settings: load it with "
                          f"the run's own model.path and model.lora settings")
    peft.set_peft_model_state_dict(model, saved)


def merged(base, directory: Path):
    """A plain `transformers` model: `base` (modified in place) with the adapter saved in `directory` folded in
    (checked as `load_adapter` checks it)."""
    peft = _peft()
    directory = Path(directory)
    read_json(directory / "adapter_config.json", "checkpoint", DAMAGED)
    try:
        config = peft.PeftConfig.from_pretrained(str(directory))
    except (ValueError, TypeError, KeyError) as err:  # fields peft does not know, or of the wrong type
        raise ConfigError(f"checkpoint '{directory}': adapter_config.json is not a peft config "
                          f"({(str(err).splitlines() or [type(err).__name__])[0][:160]}); {DAMAGED}") from None
    model = peft.get_peft_model(base, config)
    load_adapter(model, directory)
    return model.merge_and_unload()


def peft_loads(base, directory: Path, saved: Path) -> bool:
    """PEFT itself loads the adapter in `directory` onto `base`, with the weights of `saved` (a safetensors file)."""
    peft = _peft()
    import torch
    from safetensors.torch import load_file

    model = peft.PeftModel.from_pretrained(base, str(directory))
    # rlvr's adapters never train the embeddings: no look at the base's files for a resized vocabulary
    expected, loaded = load_file(str(saved)), peft.get_peft_model_state_dict(model, save_embedding_layers=False)
    return expected.keys() == loaded.keys() and all(torch.equal(expected[k], loaded[k].to(expected[k].dtype))
                                                    for k in expected)


def merged_weights(model) -> list[tuple[str, object]]:
    """(name, tensor) of `model`'s weights under the base model's own names, with each active
    adapter folded in (W + scale·B·A), for an engine that holds a plain copy of the model (vLLM).
    The model is not modified; a model without adapters gives its parameters as they are."""
    if not hasattr(model, "peft_config"):
        return [(name, p.detach()) for name, p in model.named_parameters()]
    _peft()
    import torch
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                adapters = [a for a in module.active_adapters if a in module.lora_A]
                if adapters:
                    deltas[f"{name}.base_layer.weight"] = sum(module.get_delta_weight(a) for a in adapters)
        # added in fp32, then cast: a bf16 sum would round the small update away
        return [(name.replace(".base_layer.", "."),
                 (p.detach().float() + deltas[name].float()).to(p.dtype) if name in deltas else p.detach())
                for name, p in base.named_parameters() if ".lora_" not in name]


def base_weights(model) -> list[tuple[str, object]]:
    """(name, tensor) of the base model's own weights, adapters left out (not folded in): what a
    server that applies the adapter itself starts from."""
    if not hasattr(model, "peft_config"):
        return [(name, p.detach()) for name, p in model.named_parameters()]
    return [(name.replace(".base_layer.", "."), p.detach()) for name, p in model.get_base_model().named_parameters()
            if ".lora_" not in name]


def adapter_weights(model) -> list[tuple[str, object]]:
    """(peft name, tensor) of the trainable adapter weights alone: an adapter-only push."""
    return [(name, p.detach()) for name, p in model.named_parameters() if ".lora_" in name and p.requires_grad]
