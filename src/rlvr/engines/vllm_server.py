"""vLLM as a service (`rollout.engine=vllm_server`): N server processes, data-parallel replicas.

`ServerEngine` implements `rlvr.protocols.WeightSyncEngine` like the in-process `VLLMEngine` and
samples what it samples: the same requests (one per group, `n` completions with seeds `s, s+1,
...`, `engines.vllm.group_runs`), the same sampling parameters and `processed_logprobs`, token ids
in and out (`/inference/v1/generate`, no tokenizer on the server). Each call starts from an empty
prefix cache on every server, as the in-process engine's does, so a row's sample depends on the
weights, prompt and seed only, not on which replica served it. Requests go to the replica with the
fewest requests in flight.

Weights move through vLLM's own update protocol (`/start_weight_update`, `/update_weights` per
bucket, `/finish_weight_update` with the policy version as vLLM's weight version), over the
`rlvr_shm` backend (`engines.vllm_ext`: safetensors buckets on `/dev/shm`), the path that works on
a CPU.

A server that dies is named in one line; with `on_crash="restart"` it is started again on its port,
given the newest weights (their bucket files are kept until the next push) and its requests are
sent again (seeded, so they sample the same tokens); with `"fail"` the run ends with that line.
Servers given by address (`urls`) are attached to, checked (vLLM line, model name, length), given
the trainer's weights at once, and never restarted.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import torch

from rlvr.batch import Rollouts
from rlvr.engines import server_fleet as fleet
from rlvr.engines.vllm import SHM_BACKEND, group_runs, save_for_engine
from rlvr.errors import ConfigError


def buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, cut into dicts of at most `bucket_bytes` each (a larger tensor alone in one)."""
    out: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if out[-1] and size + nbytes > bucket_bytes:
            out.append({})
            size = 0
        out[-1][name] = tensor.detach().to("cpu").contiguous()
        size += nbytes
    return [b for b in out if b]


def token_versions(choices: list[dict], width: int, start: int) -> torch.Tensor:
    """(B, width) long: the weight version vLLM reports for each output token (`weight_versions`
    spans `{version, start, end}`); a server's weights before rlvr's first push are `start`'s."""
    out = torch.full((len(choices), width), -1, dtype=torch.long)
    for row, choice in enumerate(choices):
        for span in choice.get("weight_versions") or ():
            version = span["version"]
            out[row, span["start"]:span["end"]] = int(version) if str(version).lstrip("-").isdigit() else start
    return out


def padded(choices: list[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, log-probs) (B, longest), right-padded, of the server's choices."""
    tokens = [c["token_ids"] for c in choices]
    lengths = torch.tensor([len(t) for t in tokens], dtype=torch.long)
    width = int(lengths.max()) if tokens else 0
    mask = torch.arange(width)[None, :] < lengths[:, None]
    ids = torch.full((len(tokens), width), pad_id, dtype=torch.long)
    logprobs = torch.zeros((len(tokens), width))
    ids[mask] = torch.tensor([t for row in tokens for t in row], dtype=torch.long)
    logprobs[mask] = torch.tensor([step["logprob"] for c in choices for step in c["logprobs"]["content"]])
    return ids, mask.float(), logprobs


def adapter_key(name: str) -> str:
    """peft's parameter name -> its saved name: the adapter's own name dropped
    (`...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`), as `save_pretrained` writes it."""
    head, sep, tail = name.partition(".lora_")
    kind, _, rest = tail.partition(".")
    return f"{head}{sep}{kind}.{rest.split('.', 1)[-1]}"


class ServerEngine:
    """`engine(prompt_ids, prompt_mask, seeds, *, temperature) -> Rollouts` from vLLM servers;
    `push_weights(named_tensors, version)` after each update; `close()` stops the servers it started."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], hf_config, *, max_new_tokens: int,
                 eos_id: int, pad_id: int, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, servers: int = 1, urls: tuple[str, ...] = (), port: int = 0,
                 options: fleet.ServerOptions | None = None, on_crash: str = "restart",
                 bucket_mb: int = 64, lora_config=None):
        self.max_new_tokens, self.eos_id, self.pad_id = max_new_tokens, eos_id, pad_id
        self.top_p, self.top_k, self.min_p, self.repetition_penalty = top_p, top_k, min_p, repetition_penalty
        self.options, self.on_crash, self.bucket_bytes = options or fleet.ServerOptions(), on_crash, bucket_mb << 20
        self.policy_version = 0
        self.lora_config = lora_config  # peft's LoraConfig: pushes of adapter tensors load a vLLM LoRA adapter
        self.adapter: str | None = None  # the adapter requests name (None: the base model)
        self._dir = Path(tempfile.mkdtemp(prefix="rlvr-vllm-server-"))
        shm = Path("/dev/shm")
        self._wire = Path(tempfile.mkdtemp(prefix="rlvr-weights-", dir=shm if shm.is_dir() else None))
        self._files: list[Path] = []
        self._load: dict[int, int] = {}  # requests in flight per server
        self.served: dict[int, int] = {}  # requests each server answered since the start
        self._lock = threading.Lock()
        weights = [(name, t.detach()) for name, t in named_tensors]
        self._model_dir = save_for_engine(weights, hf_config, self._dir / "model") if not urls else None
        self.servers: list[fleet.Server] = []
        try:
            self._start(servers, urls, port)
            if urls:  # an attached server holds whatever it was started with
                self.push_weights(weights, 0)
        except BaseException:
            self.close()
            raise

    def _start(self, count: int, urls: tuple[str, ...], port: int) -> None:
        o = self.options
        if urls:
            self.servers = [fleet.Server(i, url.rstrip("/")) for i, url in enumerate(urls)]
        else:
            ports = [port + i if port else fleet.free_port(o.host) for i in range(count)]
            for i, p in enumerate(ports):
                self.servers.append(fleet.launch(i, self._model_dir, p, o, self._dir))
        fleet.wait_ready(self.servers, o.start_timeout_s)
        for server in self.servers:
            fleet.check_server(server, o.max_model_len)
            self._init_transfer(server)
        self._load = {s.index: 0 for s in self.servers}
        self.served = {s.index: 0 for s in self.servers}

    def _init_transfer(self, server: fleet.Server) -> None:
        try:
            self._post(server, "/init_weight_transfer_engine", {"init_info": {}}, timeout=60)
        except fleet.ServerDown as err:
            raise ConfigError(f"rollout.server_urls: {server.name} refused rlvr's weight transfer ({err}); start it "
                              "with VLLM_SERVER_DEV_MODE=1 --worker-extension-cls " + fleet.EXTENSION +
                              f" --weight-transfer-config '{{\"backend\": \"{SHM_BACKEND}\"}}'") from None

    def _post(self, server: fleet.Server, route: str, body: dict | None = None, timeout: float | None = None):
        try:
            answer = requests.post(server.url + route, json=body, timeout=timeout)
        except requests.RequestException:
            code = server.exit_code()
            raise server.down(f"exited with code {code}" if code is not None else f"stopped answering ({route})"
                              ) from None
        if answer.status_code != 200:
            raise fleet.ServerDown(f"{server.name}: {route} answered {answer.status_code}: {answer.text[:300]}")
        try:
            return answer.json()
        except ValueError:  # the LoRA routes answer in plain text
            return answer.text

    # sampling

    def __call__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, *,
                 temperature: float | torch.Tensor) -> Rollouts:
        rows = len(prompt_ids)
        temps = temperature.tolist() if isinstance(temperature, torch.Tensor) else [float(temperature)] * rows
        prompts = [[t for t, m in zip(ids, keep) if m] for ids, keep in zip(prompt_ids.tolist(), prompt_mask.tolist())]
        runs = group_runs(prompts, seeds.tolist(), temps)
        bodies = [{"model": self.adapter or fleet.MODEL_NAME, "token_ids": prompts[start],
                   "sampling_params": self._params(temps[start], int(seeds[start]), n)} for start, n in runs]
        for server in self.servers:  # a reused block may round differently from a recomputed one
            self._with_restart(server, lambda s: self._post(s, "/reset_prefix_cache", timeout=60))
        with ThreadPoolExecutor(max_workers=max(1, min(len(bodies), 64))) as pool:
            answers = list(pool.map(self._generate, bodies))
        choices = [c for a in answers for c in sorted(a["choices"], key=lambda c: c["index"])]
        ids, mask, logprobs = padded(choices, self.pad_id)
        truncated = torch.tensor([c["finish_reason"] == "length" for c in choices], dtype=torch.bool)
        versions = token_versions(choices, ids.shape[1], 0).masked_fill(mask == 0, -1)
        return Rollouts(prompt_ids, prompt_mask, ids, mask, logprobs, truncated.view(rows), versions=versions)

    def _params(self, temperature: float, seed: int, n: int) -> dict:
        sampled = temperature > 0  # greedy: the model's argmax, no truncation or penalty (as VLLMEngine)
        return {"n": n, "temperature": temperature, "top_p": self.top_p if sampled else 1.0,
                "top_k": self.top_k if sampled else 0, "min_p": self.min_p if sampled else 0.0,
                "repetition_penalty": self.repetition_penalty if sampled else 1.0, "max_tokens": self.max_new_tokens,
                "seed": seed, "logprobs": 0, "stop_token_ids": [self.eos_id], "detokenize": False}

    def _generate(self, body: dict) -> dict:
        with self._lock:  # the replica with the fewest requests in flight
            server = min(self.servers, key=lambda s: (self._load[s.index], s.index))
            self._load[server.index] += 1
        try:
            return self._with_restart(server, lambda s: self._post(s, "/inference/v1/generate", body))
        finally:
            with self._lock:
                self._load[server.index] -= 1
                self.served[server.index] += 1

    # failures

    def _with_restart(self, server: fleet.Server, call):
        try:
            return call(server)
        except fleet.ServerDown:
            if self.on_crash != "restart" or server.process is None or server.exit_code() is None:
                raise
        self._restart(server)
        return call(server)

    def _restart(self, server: fleet.Server) -> None:
        """Start a dead server again on its port and give it the newest weights (once, whichever
        thread sees it first)."""
        with self._lock:
            if server.exit_code() is None:  # another thread restarted it already
                return
            code = server.exit_code()
            warnings.warn(f"{server.name} exited with code {code}; restarting it", stacklevel=2)
            fresh = fleet.launch(server.index, self._model_dir, server.port, self.options, self._dir,
                                 check_port=False)
            server.process, server.log = fresh.process, fresh.log
            fleet.wait_ready([server], self.options.start_timeout_s)
            self._init_transfer(server)
            if self._files:
                self._push_to(server, self._files, self.policy_version)
            if self.adapter:
                self._load_adapter(server, self.adapter, self._wire / self.adapter)

    # weights

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Write the weights (HF names; LoRA merged) in buckets to shared memory, then load them on
        every server through vLLM's weight-update protocol, tagged with `version`. LoRA adapter
        tensors alone (peft's names, `.lora_A.`/`.lora_B.`) load as a vLLM LoRA adapter instead."""
        named_tensors = list(named_tensors)
        if self.lora_config is not None and named_tensors and all(".lora_" in name for name, _ in named_tensors):
            return self._push_adapter(named_tensors, version)
        parts = buckets(named_tensors, self.bucket_bytes)
        files = []
        from safetensors.torch import save_file

        for k, part in enumerate(parts):
            path = self._wire / f"v{version}-{k}.safetensors"
            save_file(part, str(path))
            files.append(path)
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            list(pool.map(lambda s: self._with_restart(s, lambda t: self._push_to(t, files, version)), self.servers))
        for old in self._files:  # kept until now: a restarted server reloads the newest ones
            if old not in files:
                old.unlink(missing_ok=True)
        self._files, self.policy_version = files, version

    def _push_adapter(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Save the adapter as a PEFT directory under a new name per version (vLLM keys its caches
        by name, and a reload in place would let requests read half-written files), load it on
        every server, route requests to it, then unload and delete the one it replaces."""
        from safetensors.torch import save_file

        name = f"{fleet.MODEL_NAME}-v{version}"
        if name == self.adapter:  # the same version again (a resumed run's first push): already served
            return
        path = self._wire / name
        path.mkdir()
        tensors = {adapter_key(key): t.detach().to("cpu").contiguous() for key, t in named_tensors}
        save_file(tensors, str(path / "adapter_model.safetensors"))
        self.lora_config.save_pretrained(str(path))
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            list(pool.map(lambda s: self._with_restart(s, lambda t: self._load_adapter(t, name, path)), self.servers))
        old, self.adapter, self.policy_version = self.adapter, name, version
        if old is not None:
            for server in self.servers:
                self._with_restart(server, lambda t: self._post(t, "/v1/unload_lora_adapter", {"lora_name": old},
                                                                timeout=60))
            shutil.rmtree(self._wire / old, ignore_errors=True)

    def _load_adapter(self, server: fleet.Server, name: str, path: Path) -> None:
        self._post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, timeout=600)

    def _push_to(self, server: fleet.Server, files: list[Path], version: int) -> None:
        """Partial rollouts: requests in flight are frozen (`keep`), not aborted or awaited; their KV
        cache is dropped with the pause, so on resume they recompute it under the new weights and go
        on sampling, each token tagged with the version that sampled it (`Rollouts.versions`)."""
        self._post(server, "/pause?mode=keep", timeout=600)
        try:
            self._post(server, "/start_weight_update", {}, timeout=600)
            for path in files:
                self._post(server, "/update_weights", {"update_info": {"path": str(path)}}, timeout=600)
            self._post(server, "/finish_weight_update", {"weight_version": str(version)}, timeout=600)
        finally:
            self._post(server, "/resume", timeout=600)

    def close(self) -> None:
        """Stop the servers this engine started (idempotent) and delete its files."""
        for server in self.servers:
            fleet.stop(server)
        shutil.rmtree(self._wire, ignore_errors=True)
        shutil.rmtree(self._dir, ignore_errors=True)
