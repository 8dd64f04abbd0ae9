from components.env.batch_eval import wilson_interval


def test_wilson_interval_hand_values():
    """p=1/2, n=4: centre (0.5 + 1.96^2/8)/(1 + 1.96^2/4) = 0.5; half-width 0.3658..."""
    lo, hi = wilson_interval(2, 4)
    assert abs(lo - 0.1500) < 1e-3 and abs(hi - 0.8500) < 1e-3
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 0.0)
