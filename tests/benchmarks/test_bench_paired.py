"""benchmarks/paired.py: the one reading of two sides timed in the same rounds (generation, speculative, training)."""

import pytest
from bench_scripts import load_benchmark

paired = load_benchmark("paired")


def test_each_rounds_own_ratio_and_their_median():
    assert paired.round_ratios((1.0, None, 3.0), (2.0, 2.0, 2.0)) == [0.5, 1.5]  # a round without a rate is left out
    ours, other = (10.0, 30.0, 11.0, 32.0, 12.0), (9.0, 20.0, 10.0, 30.0, 11.0)  # a fast and a slow state of the host
    assert paired.paired_ratio(ours, other) == pytest.approx(sorted(o / p for o, p in zip(ours, other))[2])
    assert paired.paired_ratio(ours, other) != pytest.approx(sorted(ours)[2] / sorted(other)[2])  # not the medians' ratio


def test_no_round_with_both_sides_is_an_error_naming_them():
    with pytest.raises(ValueError, match=r"paired_ratio: no round has both sides \(ours \[None\], other \[2.0\]\)"):
        paired.paired_ratio((None,), (2.0,))
