"""`engines.vllm.group_runs`: which rows one vLLM request with `n` samples; `cache_shortfall`: when the
KV cache holds fewer rows than a step samples (no vLLM needed)."""

from rlvr.engines.vllm import cache_shortfall, group_runs


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


def test_the_cache_shortfall_counts_vllms_null_block_and_sizes_the_cache_for_every_row():
    # 10.7M-parameter Llama of bench/vs_trl.py --scale 10: 2 x 8 layers x 320 x 4 B = 20 KiB a token, so
    # 64 MiB is 25 blocks of 128 tokens; one is vLLM's null block, a row of <= 64 tokens takes one
    assert cache_shortfall(128, 25, 1, 64) == (24, 331)  # ceil(129 blocks x 64 MiB / 25)
    assert cache_shortfall(128, 129, 1, 331) is None
    assert cache_shortfall(128, 129, 2, 331) == (64, 660)  # ceil(257 x 331 / 129): rows of two blocks
