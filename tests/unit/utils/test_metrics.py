"""The one-line step summary and pass@k (the sinks: test_metrics_sinks.py)."""

from relax.utils.metrics import format_step_summary


def test_summary_line_lists_the_headline_metrics_in_order():
    line = format_step_summary(2, 10, {"rollout/reward_mean": 0.5, "train/grad_norm": 1.25,
                                       "weight_sync/gbps": 0.02, "eval/tiny/reward_mean": 0.75})
    assert line == "step 3/10 | reward 0.500 | grad_norm 1.250 | sync 0.020GB/s | tiny 0.750"


def test_pass_at_k_matches_the_combinatorial_definition():
    from math import comb

    from relax.utils.metrics import pass_at_k

    for n, c, k in [(4, 1, 1), (4, 1, 2), (8, 3, 4), (16, 0, 8), (5, 5, 5)]:
        assert abs(pass_at_k(n, c, k) - (1 - comb(n - c, k) / comb(n, k))) < 1e-12


def test_pass_rates_average_over_prompts_for_powers_of_two():
    from relax.utils.metrics import pass_rates

    out = pass_rates([[True, False, False, False], [False] * 4], prefix="eval/x")
    assert out == {"eval/x/pass@1": 0.125, "eval/x/pass@2": 0.25, "eval/x/pass@4": 0.5}
