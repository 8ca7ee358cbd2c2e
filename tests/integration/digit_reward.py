"""A reward a random-init model can learn in a few steps: the share of digits in the response.

Used by the integration test to see a real learning signal through the whole graph quickly.
"""


def reward_func(args, sample, **kwargs):
    text = sample.response
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def parity_reward(args, sample, **kwargs):
    """1 when the last generated token id is even: about half the samples, so about one group in
    eight (of four samples) is constant — food for the dynamic-sampling filter."""
    return float(sample.tokens[-1] % 2 == 0)
