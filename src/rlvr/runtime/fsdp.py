"""FSDP2 state of data-parallel learners: how a model is sharded (`fully_shard` per decoder layer),
how its full weights are gathered from the shards, and how sharded learners save and load the
model and optimizer (`ShardedState`: the full weights in the Hugging Face files, the optimizer's
shards with `torch.distributed.checkpoint`, loadable on any number of ranks)."""

from __future__ import annotations

import warnings

import torch

from rlvr.runtime.distributed import Shard
from rlvr.runtime.safe_load import load_sharded


def scalar(value) -> float:
    """A float from a tensor that may be a `DTensor` (the grad norm of sharded parameters)."""
    return float(value.full_tensor() if hasattr(value, "full_tensor") else value)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformer (`model.layers`, GPT-2's `transformer.h`, ...): the
    children of the largest `ModuleList`."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def shard_model(model: torch.nn.Module, *, param_dtype: torch.dtype | None = None,
                reduce_dtype: torch.dtype | None = None, offload: bool = False,
                in_float32: tuple[torch.nn.Module, ...] = ()) -> torch.nn.Module:
    """FSDP2 full sharding: one group per decoder layer, then the root (embeddings, head, norm).
    `param_dtype` / `reduce_dtype` (None = the parameters' own): the dtype each layer is gathered
    and computed in and the one its gradients are reduce-scattered in (`MixedPrecisionPolicy`;
    the shards and the optimizer keep the model's dtype). `offload`: the shards, their gradients
    and the optimizer's states live in CPU memory between uses (`CPUOffloadPolicy`, a GPU run).
    `in_float32`: submodules that are groups of their own, gathered, computed and reduced in
    float32 whatever `param_dtype` says (a critic's value head)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    offload_policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    policies = {"mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
                "offload_policy": offload_policy}
    for layer in decoder_layers(model):
        fully_shard(layer, **policies)
    for module in in_float32:
        fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32),
                    offload_policy=offload_policy)
    fully_shard(model, **policies)
    return model


def full_weights(named) -> dict[str, torch.Tensor]:
    """{name: full tensor} from (name, tensor) pairs whose tensors may be shards (`DTensor`):
    a collective, every rank calls it with the same names."""
    return {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach() for name, t in named}


def load_trained(model: torch.nn.Module, named) -> None:
    """The trained ones of `named` (the learner's parameters, sharded; under LoRA the adapters)
    gathered into `model`, a plain copy with the same names: a collective."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in full_weights((name, t) for name, t in named if t.requires_grad).items():
            params[name].copy_(tensor)


class ShardedState:
    """How sharded learners save and load what a checkpoint holds of the model and optimizer:
    the full weights in the Hugging Face files (gathered; what an export or a single process
    loads) and the optimizer's shards with `torch.distributed.checkpoint` in `optimizer/`, which
    any number of ranks (one process too) can load. The critic's optimizer (PPO/GAE) is a second
    one, in `CRITIC_FOLDER`, beside its gathered weights in the trainer state."""

    FOLDER = "optimizer"
    CRITIC_FOLDER = "critic_optimizer"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, shard: Shard,
                 folder: str = FOLDER):
        self.model, self.optimizer, self.shard, self.folder = model, optimizer, shard, folder

    def save_optimizer(self, folder) -> None:
        """Every rank writes its optimizer shard under `folder` (a collective). An optimizer that
        has not stepped yet (the policy's during the critic's warm-up) writes nothing: DCP would
        step it at lr 0 to make its state, which moves Adam's step count off the single process's."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        if not self.optimizer.state:
            return
        dcp.save({"optimizer": get_optimizer_state_dict(self.model, self.optimizer)},
                 checkpoint_id=str(folder / self.folder))

    def load(self, checkpoint, weights: dict[str, torch.Tensor], optimizer: dict | None = None, *,
             trust_pickle: bool = False) -> None:
        """The full `weights` into the shards, then the optimizer: its saved shards resharded to
        this run's ranks (read as `load_sharded_optimizer` says), or `optimizer`, the full state one
        process saved, cut into this rank's shards."""
        if optimizer is None:
            load_sharded_optimizer(self.model, self.optimizer, checkpoint / self.folder, weights,
                                   trust_pickle=trust_pickle)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.tensor import distribute_tensor

        set_model_state_dict(self.model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
        params = [p for group in self.optimizer.param_groups for p in group["params"]]

        def cut(value, p):  # a full per-parameter tensor (Adam's moments) -> this rank's shard of it
            if isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim() > 0:
                return distribute_tensor(value.to(p.device), p.device_mesh, p.placements)
            return value

        state = {i: {k: cut(v, params[i]) for k, v in moments.items()} for i, moments in optimizer["state"].items()}
        self.optimizer.load_state_dict({"state": state, "param_groups": optimizer["param_groups"]})

    def barrier(self) -> None:
        torch.distributed.barrier()


def load_sharded_optimizer(model, optimizer, folder, weights: dict[str, torch.Tensor] | None = None, *,
                           trust_pickle: bool = False) -> None:
    """Load `weights` (full tensors by name; None = keep the model's) and the optimizer state a
    `ShardedState` saved in `folder`, into `model` and `optimizer` however they are sharded (a
    plain model in a single process too); no folder: the optimizer had not stepped, it stays fresh.
    The folder's pickles are read with an allow-list (`runtime.safe_load`) unless `trust_pickle`."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if weights is not None:
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    if not (folder / ".metadata").is_file():
        return
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    with warnings.catch_warnings():  # one process loading shards: DCP warns that it assumes so
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load_sharded(state, folder, trust_pickle=trust_pickle)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
