"""Runs inside vLLM server workers (`--worker-extension-cls rlvr.engines.vllm_ext.RlvrWorkerExtension`).

Importing this module in a worker registers the `rlvr_shm` weight-transfer backend with vLLM's
own four-phase update protocol (`/start_weight_update`, `/update_weights` per bucket,
`/finish_weight_update`): the trainer writes each bucket of weights as one safetensors file under
`/dev/shm`, and the worker loads it with the model's `load_weights` inside vLLM's layerwise reload.
vLLM's built-in backends (NCCL, CUDA IPC) need a GPU; this one is what a CPU machine (and CI) runs.

`finish_weight_update` also refreshes a tied output head, which vLLM's reload skips (the same fix
as `rlvr.engines.vllm._reload_weights`: on CPU the head keeps a packed copy of the old embedding).
"""

from __future__ import annotations

from dataclasses import dataclass

from safetensors.torch import load_file
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload, initialize_layerwise_reload

BACKEND = "rlvr_shm"


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    pass


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    path: str
    """One bucket: a safetensors file of HF-named tensors."""


def refresh_tied_head(model, model_config) -> None:
    """Re-run a tied `lm_head`'s post-load step, so it packs the newly loaded embedding."""
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if getattr(model_config.hf_config, "tie_word_embeddings", False) and method is not None:
        method.process_weights_after_loading(head)


class ShmEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    """Buckets of safetensors files on shared memory, loaded in checkpoint format."""

    init_info_cls, update_info_cls = ShmInitInfo, ShmUpdateInfo

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        self.model.load_weights(list(load_file(update_info.path).items()))

    def finish_weight_update(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)
        refresh_tied_head(self.model, self.model_config)

    def shutdown(self) -> None:
        pass


if BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(BACKEND, ShmEngine)


class RlvrWorkerExtension:
    """Mixed into vLLM's worker class; its only job is importing this module (the registration)."""
