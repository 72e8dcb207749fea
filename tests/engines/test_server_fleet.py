"""The server engine's one-line failures, against small stand-in HTTP servers (no vLLM needed):
a port in use, a server that never becomes ready or exits first, another vLLM version or model,
a server without rlvr's weight transfer; and the weight buckets."""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from rlvr.engines import server_fleet as fleet
from rlvr.errors import ConfigError


def _stand_in(routes: dict[str, tuple[int, dict]]):
    """A loopback HTTP server answering GET/POST `route` with (status, JSON body); 404 elsewhere."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            status, body = routes.get(self.path, (404, {"error": "no route"}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


GOOD = {"/health": (200, {}), "/version": (200, {"version": "0.32.0"}),
        "/v1/models": (200, {"data": [{"id": "rlvr", "max_model_len": 64}]})}


@pytest.fixture
def stand_in():
    made = []

    def make(**changes):
        httpd, url = _stand_in({**GOOD, **changes})
        made.append(httpd)
        return fleet.Server(0, url)

    yield make
    for httpd in made:
        httpd.shutdown()


def test_a_port_in_use_is_refused_before_starting(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = rf"^rollout.server_port: port {port} on 127.0.0.1 is in use \(server 0\)"
        with pytest.raises(ConfigError, match=refused):
            fleet.launch(0, tmp_path, port, fleet.ServerOptions(), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing was started


def test_a_server_that_never_answers_health_stops_the_start_in_one_line(stand_in):
    server = stand_in(**{"/health": (503, {})})
    with pytest.raises(fleet.ServerDown) as failed:
        fleet.wait_ready([server], timeout_s=1.0)
    assert str(failed.value) == f"vLLM server 0 ({server.url}) was not ready after 1 s (rollout.server_start_timeout_s)"


def test_a_server_that_exits_before_ready_is_named_with_its_log_line(tmp_path):
    log = tmp_path / "vllm-server-0.log"
    log.write_text("INFO starting\nValueError: max_model_len 512 > max_position_embeddings 256\n")
    import subprocess

    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    server = fleet.Server(0, "http://127.0.0.1:9", process, log, 9)
    with pytest.raises(fleet.ServerDown) as failed:
        fleet.wait_ready([server], timeout_s=30)
    assert str(failed.value) == ("vLLM server 0 (http://127.0.0.1:9) exited with code 3 before it was ready: "
                                 f"ValueError: max_model_len 512 > max_position_embeddings 256; log {log}")


def test_version_model_and_length_mismatches_are_one_line_config_errors(stand_in):
    fleet.check_server(stand_in(), max_model_len=64)  # the good one passes
    with pytest.raises(ConfigError, match=r"runs vLLM 0.31.2; rlvr's server engine speaks vLLM 0.32.x"):
        fleet.check_server(stand_in(**{"/version": (200, {"version": "0.31.2"})}), 64)
    with pytest.raises(ConfigError, match=r"serves \['Qwen/Qwen3-0.6B'\], not 'rlvr'; start it with --served-model"):
        fleet.check_server(stand_in(**{"/v1/models": (200, {"data": [{"id": "Qwen/Qwen3-0.6B"}]})}), 64)
    with pytest.raises(ConfigError, match=r"holds 64 tokens, the run needs 128; restart it with --max-model-len 128"):
        fleet.check_server(stand_in(), 128)


def test_an_attached_server_without_rlvrs_weight_transfer_is_refused(stand_in):
    from rlvr.engines.vllm_server import ServerEngine

    server = stand_in(**{"/init_weight_transfer_engine": (404, {"detail": "Not Found"})})
    with pytest.raises(ConfigError, match=r"^rollout.server_urls: vLLM server 0 .* refused rlvr's weight transfer .*"
                                          r"VLLM_SERVER_DEV_MODE=1 --worker-extension-cls rlvr.engines.vllm_ext"):
        ServerEngine([("w", torch.zeros(2))], None, max_new_tokens=4, eos_id=2, pad_id=0, urls=(server.url,))


def test_buckets_keep_order_and_size():
    from rlvr.engines.vllm_server import buckets

    tensors = [(f"t{i}", torch.full((n,), float(i))) for i, n in enumerate([10, 10, 30, 5, 5])]  # fp32: 4 bytes each
    parts = buckets(tensors, bucket_bytes=80)
    assert [list(p) for p in parts] == [["t0", "t1"], ["t2"], ["t3", "t4"]]  # t2 (120 B) alone, over the bound
    assert all(torch.equal(parts[k][name], t) for k, p in enumerate(parts) for name, t in tensors if name in p)


def test_server_command_loopback_and_rlvr_backend(tmp_path):
    args = fleet.server_command(Path("/m"), 8123, fleet.ServerOptions(max_model_len=64, block_size=32))
    assert args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    def flag(name):
        return args[args.index(name) + 1]

    assert flag("--host") == "127.0.0.1" and flag("--port") == "8123" and flag("--served-model-name") == "rlvr"
    assert json.loads(flag("--weight-transfer-config")) == {"backend": "rlvr_shm"}
    assert flag("--max-model-len") == "64" and flag("--block-size") == "32"
    assert "--max-model-len" not in fleet.server_command(Path("/m"), 1, fleet.ServerOptions())


def test_attaching_and_starting_servers_are_not_mixed():
    from rlvr.config import load_config

    with pytest.raises(ConfigError, match=r"rollout.server_urls: attaches to running servers .* leave rollout.servers"):
        load_config(None, ["rollout.engine=vllm_server", "rollout.server_urls=http://127.0.0.1:8000",
                           "rollout.servers=2"])
    with pytest.raises(ConfigError, match=r"rollout.servers.*only read with rollout.engine=vllm_server"):
        load_config(None, ["rollout.servers=2"])
    with pytest.raises(ConfigError, match=r"trainer.backend: rollout.engine=vllm_server runs its servers from this"):
        load_config(None, ["rollout.engine=vllm_server", "trainer.backend=ray"])
    assert load_config(None, ["rollout.engine=vllm_server", "rollout.servers=2"]).rollout.servers == 2
