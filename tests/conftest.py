import errno
import importlib.util
import os
import subprocess
import threading
import time

import pytest
import torch

from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer

EXTRAS = {"vllm": "vllm", "ray": "ray"}  # marker -> the module its tests need (an optional extra)


def pytest_runtest_setup(item):
    """A test marked with an extra's name skips when the extra is not installed, except where
    RLVR_REQUIRE_EXTRAS=1 (CI installs the extras): then it fails, so CI never skips it silently."""
    for marker, module in EXTRAS.items():
        if item.get_closest_marker(marker) and importlib.util.find_spec(module) is None:
            message = f"needs the {marker} extra: pip install -e '.[{marker}]'"
            if os.environ.get("RLVR_REQUIRE_EXTRAS") == "1":
                pytest.fail(f"RLVR_REQUIRE_EXTRAS=1 but {module} is not importable ({message})", pytrace=False)
            pytest.skip(message)


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray on 2 CPUs for one test module (its tests are marked `ray`, so the extra was checked)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _cpu_s(thread: threading.Thread) -> float:
    """CPU seconds `thread` has used (Linux: its /proc task's utime + stime); 0 where unreadable."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module", autouse=True)
def _no_spinning_threads():
    """A module must not leave a thread computing after its tests: one spinning in a test's verifier
    once held the GIL for the rest of the suite and ran every later test up to 20 times slower."""
    yield
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and t.native_id]
    before = {t: _cpu_s(t) for t in others}
    time.sleep(0.1)
    spinning = [t.name for t in others if t.is_alive() and _cpu_s(t) - before[t] > 0.05]
    assert not spinning, f"threads still computing after the module's tests: {spinning}; end them in the test"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def tokenizer():
    return char_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    return tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_seq_len=64, seed=0)


@pytest.fixture
def make_train_batch(tokenizer):
    """`make(model, prompts, seed=, with_old=)`: a TrainBatch of sampled completions (10 tokens at
    most) with seeded random advantages and perturbed old / reference log-probs."""
    from rlvr.batch import TrainBatch
    from rlvr.codec import encode_prompts
    from rlvr.engines.torch_ar import generate

    def make(model, prompts, *, seed: int = 1, with_old: bool = True):
        ids, mask = encode_prompts(tokenizer, prompts)
        out = generate(model, ids, mask, torch.arange(len(prompts)), max_new_tokens=10,
                       eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
        gen = torch.Generator().manual_seed(seed)
        adv = torch.randn(len(prompts), 1, generator=gen) * out.completion_mask
        old = (out.logprobs + 0.3 * torch.randn(out.logprobs.shape, generator=gen)) * out.completion_mask
        ref = (out.logprobs - 0.2 * torch.rand(out.logprobs.shape, generator=gen)) * out.completion_mask
        return TrainBatch(ids, mask, out.completion_ids, out.completion_mask, adv,
                          old_logp=old if with_old else None, ref_logp=ref)

    return make


@pytest.fixture
def tmpfs(tmp_path):
    """`tmpfs(size)` -> a folder with a tmpfs of `size` (e.g. "2m") mounted on it: a disk the test can
    fill. Mounting needs root, which CI has; the mounts are undone after the test."""
    mounted = []

    def mount(size: str):
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root (CI runs as root)")
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


def _fill(folder):
    """Write zeros into `folder` until its disk is full (to the last block); returns the filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        try:
            while True:
                os.write(fd, b"\0" * 65536)
        except OSError as err:
            assert err.errno == errno.ENOSPC
        try:
            while True:
                os.write(fd, b"\0" * 512)
        except OSError:
            pass
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def fill_disk():
    """`fill_disk(folder)`: fill the disk `folder` is on (a `tmpfs` one); returns the filler file."""
    return _fill
