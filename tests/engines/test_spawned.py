"""`SpawnedEngine`: an engine in a spawned process of its own (what a learner rank runs vLLM in),
and `LeadEngine`: rank 0's engine fed the gathered weights, merged under LoRA."""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch

from rlvr.engines.ranks import LeadEngine
from rlvr.engines.spawned import SpawnedEngine
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.lora import merged_weights
from rlvr.models.tokenizer import char_tokenizer
from rlvr.runtime.distributed import Shard


class Doubler:
    """A toy engine: returns twice its prompt ids (plus the last pushed weight's sum), and what it
    sees of the launcher's variables and its process."""

    def __init__(self, offset: float):
        self.offset, self.pushed = offset, 0.0

    def __call__(self, prompt_ids, prompt_mask, seeds, *, temperature):
        if temperature < 0:
            raise ValueError(f"temperature {temperature} < 0")
        return {"out": prompt_ids * 2 + self.offset + self.pushed, "rank": os.environ.get("RANK"),
                "pid": os.getpid()}

    def push_weights(self, named_tensors, version: int) -> None:
        self.pushed = sum(float(t.sum()) for _, t in named_tensors) + version

    def close(self) -> None:
        pass


def _fails(offset: float):
    raise ValueError(f"no engine at offset {offset}")


@pytest.mark.slow  # two spawned processes, each importing torch: ~15 s on two shared cores
def test_a_spawned_engine_answers_from_its_own_process_without_the_launcher_variables(monkeypatch):
    monkeypatch.setenv("RANK", "0")  # as torchrun sets it: the child must not see it
    engine = SpawnedEngine(functools.partial(Doubler, 1.0))
    try:
        ids = torch.tensor([[1, 2], [3, 4]])
        got = engine(ids, torch.ones_like(ids), torch.arange(2), temperature=1.0)
        assert torch.equal(got["out"], ids * 2 + 1.0)
        assert got["rank"] is None and got["pid"] != os.getpid()
        engine.push_weights([("w", torch.full((2,), 1.5))], version=4)  # sum 3 + version 4
        assert torch.equal(engine(ids, ids, ids, temperature=1.0)["out"], ids * 2 + 8.0)
        with pytest.raises(ValueError, match=r"temperature -1\.0 < 0"):
            engine(ids, ids, ids, temperature=-1.0)
        assert torch.equal(engine(ids, ids, ids, temperature=0.0)["out"], ids * 2 + 8.0)  # still serving
    finally:
        engine.close()
    assert not engine._process.is_alive()
    with pytest.raises(ValueError, match="no engine at offset 2.0"):
        SpawnedEngine(functools.partial(_fails, 2.0))


class Recorder:
    def __init__(self):
        self.pushes = []

    def push_weights(self, named_tensors, version: int) -> None:
        self.pushes.append(({name: t.clone() for name, t in named_tensors}, version))


def _model():
    return tiny_llama(len(char_tokenizer()), hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                      max_seq_len=32, seed=0)


def test_the_lead_engine_loads_the_trained_weights_and_pushes_them_to_its_engine():
    plain, trained = _model(), _model()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.25)
    engine = LeadEngine(Recorder(), plain, Shard(0, 1, fsdp=True))
    engine.push_weights(list(trained.named_parameters()), version=3)
    pushed, version = engine.engine.pushes[-1]
    assert version == 3 and engine.version == 3
    expected = dict(trained.named_parameters())
    assert pushed.keys() == expected.keys()
    assert all(torch.equal(pushed[name], expected[name]) for name in expected)
    assert all(torch.equal(p, expected[name]) for name, p in plain.named_parameters())  # the copy checkpoints save


def test_under_lora_the_lead_engine_pushes_the_merged_weights():
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    plain = get_peft_model(_model(), config)
    trained = copy.deepcopy(plain)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)  # B = 0 at the start: the adapters now change the weights
    engine = LeadEngine(Recorder(), plain, Shard(0, 1, fsdp=True))
    engine.push_weights(list(trained.named_parameters()), version=1)
    pushed, _ = engine.engine.pushes[-1]
    merged = dict(merged_weights(trained))
    base = dict(_model().named_parameters())
    assert pushed.keys() == merged.keys() == base.keys()  # the base model's own names, no adapters
    assert all(torch.allclose(pushed[n], merged[n]) for n in merged)
    assert not torch.allclose(pushed["model.layers.0.self_attn.q_proj.weight"],
                              base["model.layers.0.self_attn.q_proj.weight"])
