"""Row parallelism (`trainer.thread_mode=rows`): the same samples and the same update as serial.

Sampling: each row has its own seed, so the split engine gives the whole batch's tokens (log-probs
equal to float rounding: the matmuls see other batch shapes). Update: each worker takes the
gradient of its rows and the pieces are added in row order, which is exactly what serial
micro-batches of those rows accumulate, so parameters after the step are bitwise equal. No
timings here: bench/vs_trl.py --thread-mode rows measures speed.
"""

import functools
import threading
import time

import pytest
import torch

from rlvr.algos.aggregate import AGGREGATIONS
from rlvr.algos.kl import k3
from rlvr.algos.objectives import ppo_clip
from rlvr.builder.components import build_components
from rlvr.codec import encode_prompts
from rlvr.config import load_config
from rlvr.engines.rows import split_engine
from rlvr.engines.torch_ar import generate
from rlvr.errors import ConfigError
from rlvr.kernels import native
from rlvr.models.policy import CausalPolicy
from rlvr.runtime.process import configure_for
from rlvr.runtime.rows import CoreLease, RowPool, configure_threads, resolve_mode, waiting
from rlvr.trainer import sync
from rlvr.trainer.step import LossSpec, optimizer_step

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4 1>17:", "7>7:"] * 3  # 15 rows: uneven split


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_wait_gives_the_held_core_to_the_other_side():
    """`rows.waiting()` (a tool's round trip in the rollout thread) frees the core the thread holds:
    with one core, another thread takes it during the wait and the waiter has it back after."""
    lease = CoreLease(1)
    took = threading.Event()

    def other():
        with lease.held():
            took.set()

    with lease.held():
        thread = threading.Thread(target=other)
        thread.start()
        assert not took.wait(0.1)  # the only core is held
        with waiting():
            assert took.wait(2.0)
            thread.join(2.0)
        assert lease.borrow(1) == 0  # held again after the wait
    with waiting():  # a thread that holds no core: nothing to give
        assert lease.borrow(1) == 1


def test_slices_cover_rows_in_order():
    pool = RowPool(3)
    assert pool.slices(10) == [slice(0, 3), slice(3, 6), slice(6, 10)]
    assert pool.slices(2) == [slice(0, 1), slice(1, 2)]  # never an empty piece
    assert pool.slices(0) == []
    with pytest.raises(ValueError, match="at least 2"):
        RowPool(1)


def test_map_runs_in_workers_keeps_order_and_grad_mode():
    pool = RowPool(2)
    seen = []

    def piece(rows):
        seen.append(threading.current_thread().name)
        return rows.start, torch.is_grad_enabled()

    with torch.no_grad():
        out = pool.map(piece, 9)
    assert out == [(0, False), (4, False)]
    assert all(name.startswith("rlvr-rows") for name in seen)
    assert pool.map(lambda rows: torch.is_grad_enabled(), 4) == [True, True]


def test_core_lease_never_computes_on_more_threads_than_cores():
    """Two sides of one process, each with a 2-worker pool under one lease of 2 cores: the slices
    in flight never outnumber the cores, a side alone gets both, and the results are in row order."""
    lease = CoreLease(2)
    pools = [RowPool(2, lease), RowPool(2, lease)]
    lock, running, most = threading.Lock(), [0], [0]

    def piece(rows):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.01)
        with lock:
            running[0] -= 1
        return rows.start

    assert pools[0].map(piece, 8) == [0, 4] and most[0] == 2  # alone: both cores
    outs = [None, None]

    def side(i):
        with lease.held():  # the side's own core, as the learner and the rollout thread hold theirs
            outs[i] = [pools[i].map(piece, 8) for _ in range(20)]

    threads = [threading.Thread(target=side, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 2 and outs == [[[0, 4]] * 20] * 2


def test_a_side_asking_for_its_core_stops_new_borrowing():
    """Without this the learner, borrowing again at every micro-batch, could starve the rollout side."""
    lease, got = CoreLease(2), threading.Event()

    def other_side():
        with lease.held():
            got.set()

    with lease.held():
        assert lease.borrow(5) == 1  # the one free core
        other = threading.Thread(target=other_side)
        other.start()
        while not lease._asking:  # the other side waits for a core
            threading.Event().wait(0.001)
        lease._give_back(1)
        assert lease.borrow(1) == 0  # it goes to the side that asked, not back to this one
        assert got.wait(5)
        other.join(5)
    assert lease.borrow(5) == 2  # all given back


def test_a_side_that_waits_gives_its_core_back_until_it_computes_again():
    """The rollout side scoring (a judge, a sandbox) releases its core; the learner computes on it."""
    lease, learner_in, learner_done = CoreLease(1), threading.Event(), threading.Event()

    def learner():
        with lease.held():
            learner_in.set()
            time.sleep(0.05)
            learner_done.set()  # still holding the core

    with lease.held():
        assert lease.borrow(1) == 0  # the one core is this side's
        other = threading.Thread(target=learner)
        other.start()
        with lease.released():
            assert learner_in.wait(5)  # the learner took the released core
        assert learner_done.is_set()  # back from the wait, this side had its core only once the learner was done
        other.join(5)
    assert lease.borrow(1) == 1
    lease._give_back(1)
    with lease.released():  # holding none: nothing to give back
        assert lease.borrow(1) == 1
        lease._give_back(1)


def test_configure_threads():
    torch.set_num_threads(2)
    assert configure_threads(0, "ops") is None and torch.get_num_threads() == 2
    pool = configure_threads(0, "rows")  # torch's count becomes the worker count, ops go single-threaded
    assert pool.workers == 2 and torch.get_num_threads() == 1
    assert configure_threads(1, "rows") is None and torch.get_num_threads() == 1
    assert configure_threads(3, "rows").workers == 3


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("engine", ["eager", "cpp"])
def test_split_engine_samples_the_same_rollouts(tiny_model, tokenizer, engine, shared, monkeypatch):
    """With `model` given, the workers share one weight preparation (one C++ engine built, then forked)."""
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    seeds = torch.arange(100, 100 + len(PROMPTS))
    kw = {"max_new_tokens": 12, "eos_id": tokenizer.eos_token_id, "pad_id": tokenizer.pad_token_id, "engine": engine}
    whole = generate(tiny_model, ids, mask, seeds, temperature=1.0, **kw)

    def run(p_ids, p_mask, s, *, temperature):
        return generate(tiny_model, p_ids, p_mask, s, temperature=temperature, **kw)

    built = []
    module = native.load() if engine == "cpp" else None
    if module is not None:
        engine_class = module.Engine
        monkeypatch.setattr(module, "Engine", lambda *a: built.append(1) or engine_class(*a), raising=False)
    split = split_engine(run, RowPool(2), tokenizer.pad_token_id, tiny_model if shared else None)(
        ids, mask, seeds, temperature=1.0)
    if module is not None:
        assert len(built) == (1 if shared else 2)
    assert torch.equal(split.completion_ids, whole.completion_ids)
    assert torch.equal(split.completion_mask, whole.completion_mask)
    assert torch.equal(split.prompt_ids, whole.prompt_ids) and torch.equal(split.truncated, whole.truncated)
    torch.testing.assert_close(split.logprobs, whole.logprobs, atol=2e-5, rtol=0)
    assert whole.completion_mask.sum(-1).float().std() > 0  # ragged lengths: the padding path is exercised


def _step(model, batch, *, micro_batch_size, rows):
    policy = CausalPolicy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    spec = LossSpec(objective=functools.partial(ppo_clip, clip_low=0.2, clip_high=0.28),
                    aggregation=AGGREGATIONS["seq_mean_token_mean"], kl_estimator=k3, entropy_coef=0.01)
    metrics = optimizer_step(policy, optimizer, scheduler, batch, spec, micro_batch_size=micro_batch_size,
                             grad_clip=1.0, kl_coef=0.1, rows=rows)
    return metrics, [p.detach().clone() for p in model.parameters()]


def test_row_split_update_equals_serial_micro_batches(tiny_model, make_train_batch):
    torch.set_num_threads(1)
    batch = make_train_batch(tiny_model, PROMPTS, seed=3).select(slice(0, 12))
    start = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    before = [p.detach().clone() for p in tiny_model.parameters()]
    # Micro-batches of 6 rows split over 2 workers are pieces of 3: serial micro-batches of 3.
    ref_metrics, ref_params = _step(tiny_model, batch, micro_batch_size=3, rows=None)
    tiny_model.load_state_dict(start)
    metrics, params = _step(tiny_model, batch, micro_batch_size=6, rows=RowPool(2))
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert any(not torch.equal(a, b) for a, b in zip(params, before))  # the step did move the model
    assert metrics.keys() == ref_metrics.keys()
    for key in metrics:
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-6, abs=1e-9), key


def test_auto_thread_mode_splits_rows_of_causal_models_only():
    assert load_config(None, []).trainer.thread_mode == "auto"
    assert resolve_mode("auto", "causal") == "rows" and resolve_mode("auto", "diffusion") == "ops"
    assert resolve_mode("ops", "causal") == "ops" and resolve_mode("rows", "causal") == "rows"
    load_config(None, ["model.kind=diffusion"])  # auto is valid for diffusion models (it means ops there)


def test_thread_mode_config_errors():
    with pytest.raises(ConfigError, match="trainer.thread_mode: must be one of 'auto', 'ops', 'rows', got 'cores'"):
        load_config(None, ["trainer.thread_mode=cores"])
    with pytest.raises(ConfigError, match="trainer.thread_mode: 'rows' splits causal-model batches only"):
        load_config(None, ["trainer.thread_mode=rows", "model.kind=diffusion"])
    with pytest.raises(ConfigError, match="trainer.threads: must be >= 0"):
        load_config(None, ["trainer.threads=-1"])


def test_rl_step_in_rows_mode_learns_the_same_as_ops(tmp_path):
    """Two steps of the default config from the warm start: rows mode (2 workers, micro-batch 16)
    against ops mode with 1 thread and micro-batches of 8 (the pieces rows mode makes): same
    rewards (same samples) and the same parameters after both steps, to float rounding."""
    common = ["trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=8", "algo.dynamic_sampling=false",
              "rollout.max_new_tokens=12"]
    ops_config = load_config(None, [*common, "trainer.threads=1", "trainer.micro_batch_size=8"])
    ops = build_components(ops_config, runtime=configure_for(ops_config))
    rows_config = load_config(None, [*common, "trainer.threads=2", "trainer.thread_mode=rows",
                                     "trainer.micro_batch_size=16"])
    rows = build_components(rows_config, runtime=configure_for(rows_config))
    assert ops.learner.rows is None and rows.learner.rows is not None and torch.get_num_threads() == 1
    for step in (1, 2):
        m_ops, _ = sync.rl_step(ops, step)
        m_rows, _ = sync.rl_step(rows, step)
        assert m_rows["reward/mean"] == m_ops["reward/mean"]
        assert m_rows["response/length_mean"] == m_ops["response/length_mean"]
        assert m_rows["loss/policy"] == pytest.approx(m_ops["loss/policy"], rel=1e-5, abs=1e-7)
    for a, b in zip(ops.learner.model.parameters(), rows.learner.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_cli_run_in_rows_mode_records_its_threads(tmp_path, capsys):
    import json

    from rlvr.cli import main

    code = main(["train", "trainer.steps=2", "trainer.eval_every=0", f"trainer.out_dir={tmp_path}", "trainer.name=rows",
                 "rollout.prompts_per_step=2", "rollout.group_size=4", "trainer.thread_mode=rows", "trainer.threads=2"])
    assert code == 0, capsys.readouterr().err
    runtime = json.loads((tmp_path / "rows" / "run.json").read_text())["runtime"]
    assert runtime["row_workers"] == 2 and runtime["torch_threads"] == 1


def test_a_map_takes_a_core_that_frees_up_while_its_slices_wait():
    """The other side gives its core back mid-map: the waiting slice runs on it at once, beside the
    caller's slice (without the hand-over it would wait for the caller's slice to end)."""
    lease = CoreLease(2)
    pool = RowPool(2, lease)
    other_holds, free_other, beside = threading.Event(), threading.Event(), threading.Event()

    def other_side():
        with lease.held():
            other_holds.set()
            assert free_other.wait(5)

    def piece(rows):
        if rows.start == 0:
            free_other.set()
            return beside.wait(5)  # True only if slice 2 started while this one runs
        beside.set()
        return True

    other = threading.Thread(target=other_side)
    other.start()
    assert other_holds.wait(5)
    with lease.held():
        assert pool.map(piece, 4) == [True, True]
    other.join(5)
    assert lease.borrow(5) == 2  # every core given back
