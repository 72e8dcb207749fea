"""rlvr against verl 0.9.1's core_algos outputs saved by bench/parity_verl.py (no verl needed).

The fixture holds verl's outputs for every registry entry (advantage estimators, policy losses,
aggregations, KL estimators, entropy, value loss) on the bench's seeded edge cases; the inputs
are regenerated here by the bench's own builder and checked against the fixture's checksum.
Every difference must be one of the bench's documented deviations, within its stated bound."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("parity_verl", ROOT / "bench" / "parity_verl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rlvr_matches_verl_outside_the_documented_deviations():
    bench = _bench()
    saved = torch.load(bench.FIXTURE, weights_only=False)
    entries = bench.entries()
    assert [(e["family"], e["fn"], e["case"]) for e in entries] == [
        (e["family"], e["fn"], e["case"]) for e in saved["entries"]]
    cases = {(e["case"], e["seed"]): bench._case(e["case"], e["seed"]) for e in entries}
    assert bench.digest(cases) == pytest.approx(saved["digest"], rel=1e-12), "inputs no longer regenerate"
    verdicts = []
    for e, theirs in zip(entries, saved["verl"]):
        case = cases[(e["case"], e["seed"])]
        verdicts.append(bench.compare(e, case, bench.rlvr_outputs(e, case), theirs))
    mismatches = [(e["fn"], e["case"], d) for e, (status, d) in zip(entries, verdicts) if status == "mismatch"]
    assert mismatches == []
    matched = sum(status == "match" for status, _ in verdicts)
    assert matched >= 0.8 * len(verdicts)  # deviations stay the exception


def test_a_wrong_formula_is_caught():
    bench = _bench()
    saved = torch.load(bench.FIXTURE, weights_only=False)
    i = next(k for k, e in enumerate(saved["entries"]) if e["fn"] == "vanilla" and e["case"] == "random")
    e = saved["entries"][i]
    case = bench._case(e["case"], e["seed"])
    ours = bench.rlvr_outputs(e, case)
    ours["loss"] = ours["loss"] * 1.001
    assert bench.compare(e, case, ours, saved["verl"][i])[0] == "mismatch"


def test_gmpo_on_token_advantages_grpo_passk_gpg_f_norm_and_dppo_at_cap_3_match_verl():
    bench = _bench()
    saved = torch.load(bench.FIXTURE, weights_only=False)
    fns = ("grpo_passk", "gpg_f_norm", "dppo_tv_cap3", "dppo_kl_cap3")
    wanted = {("geo_mean", "per_token_advantages")} | {(fn, e["case"]) for e in saved["entries"] for fn in fns}
    verdicts = {}
    for e, theirs in zip(saved["entries"], saved["verl"]):
        if (e["fn"], e["case"]) in wanted:
            case = bench._case(e["case"], e["seed"])
            verdicts[(e["fn"], e["case"])] = bench.compare(e, case, bench.rlvr_outputs(e, case), theirs)[0]
    assert len(verdicts) == 1 + 11 + 11 + 12 + 12
    assert set(verdicts.values()) == {"match"}
    # rlvr's own DPPO default (ratio_cap 20) differs from verl's (3.0) only where an inside token's ratio exceeds 3
    i = next(k for k, e in enumerate(saved["entries"]) if e["fn"] == "dppo_tv_defaults"
             and e["case"] == "log_ratio_beyond_20")
    e = saved["entries"][i]
    case = bench._case(e["case"], e["seed"])
    assert bench.compare(e, case, bench.rlvr_outputs(e, case), saved["verl"][i])[0] == "deviation"
