"""`engines.vllm.group_runs`: which rows one vLLM request with `n` samples (no vLLM needed)."""

from rlvr.engines.vllm import group_runs


def test_a_group_of_one_prompt_with_consecutive_seeds_is_one_request():
    prompts = [[5, 6]] * 4 + [[7]] * 4
    seeds = [10, 11, 12, 13, 14, 15, 16, 17]
    assert group_runs(prompts, seeds, [1.0] * 8) == [(0, 4), (4, 4)]


def test_a_run_breaks_at_another_prompt_temperature_or_seed():
    prompts = [[1], [1], [1], [1], [2], [2]]
    seeds = [0, 1, 2, 9, 10, 11]
    temperatures = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]  # a greedy row at the end of a group
    assert group_runs(prompts, seeds, temperatures) == [(0, 2), (2, 1), (3, 1), (4, 2)]
    assert group_runs([], [], []) == []
