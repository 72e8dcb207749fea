"""Runs inside vLLM server workers (`--worker-extension-cls rlvr.engines.vllm_ext.RlvrWorkerExtension`).

vLLM's worker imports this module to mix the class below into itself; the import registers the
`rlvr_shm` weight-transfer backend (`engines.vllm.register_shm_backend`), which the worker then
finds by name when it loads the model (`--weight-transfer-config '{"backend": "rlvr_shm"}'`).
"""

from __future__ import annotations

from rlvr.engines.vllm import register_shm_backend

register_shm_backend()


class RlvrWorkerExtension:
    """Mixed into vLLM's worker class; its only job is importing this module (the registration)."""
