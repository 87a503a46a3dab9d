"""The ``ado`` mixing method and ``loss_ratio``'s rule 2: ado's fit recovers known curves, a noise
dataset loses weight within the first stretches while a learnable one gains, the weights are the
same bit for bit for the same inputs and after a resume from the state (plain JSON); loss_ratio
judges a fall against its noise, and a state saved before its rule was versioned resumes with the
rule it started with."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest

from energon_platform.loader.mixing import make_method
from energon_platform.loader.mixing.adapter import on_grid
from energon_platform.loader.mixing.ado import fit, potential

#: samples of each dataset per stretch in the synthetic runs
PER_STRETCH = 16


@pytest.mark.parametrize(
    "eps,beta,alpha", [(1.0, 3.0, 0.5), (2.0, 5.0, 0.3), (0.5, 1.0, 1.2), (0.0, 4.0, 0.08)]
)
def test_the_fit_recovers_the_parameters_of_a_power_law(eps, beta, alpha):
    ns = [PER_STRETCH * (i + 0.5) for i in range(24)]
    got = fit(ns, [eps + beta * n**-alpha for n in ns])
    assert got == pytest.approx((eps, beta, alpha), rel=1e-4, abs=1e-4)
    assert potential(got, 400.0) == pytest.approx(alpha * beta * 400.0 ** (-alpha - 1), rel=1e-3)


def test_the_fit_of_a_flat_or_rising_loss_falls_no_more():
    ns = [PER_STRETCH * (i + 0.5) for i in range(10)]
    assert fit(ns, [2.5] * 10)[1] == 0.0
    assert fit(ns, [1 + 0.01 * i for i in range(10)])[1] == 0.0


def curves(stretch: int, rng: random.Random) -> list[float]:
    """Mean losses in a stretch, rounded as the adapter rounds them: a learnable dataset (a
    falling power law), a noise dataset (flat, noisy), a slow learnable one."""
    n = PER_STRETCH * (stretch + 0.5)
    raw = [1 + 3 * n**-0.5, 5 + rng.gauss(0, 0.05), 2 + 2 * n**-0.3]
    return [round(v / 0.01) * 0.01 for v in raw]


def run(updates: int, seed: int = 1, resume_at: int | None = None) -> list[tuple[str, ...]]:
    """The grid weights of ``ado`` over ``updates`` stretches (equal start), restarted from its
    state (through JSON) before update ``resume_at``."""
    rng = random.Random(seed)
    method = make_method("ado", ["learn", "noise", "slow"], [1, 1, 1], {})
    out = []
    for u in range(updates):
        if u == resume_at:
            state = json.loads(json.dumps(method.state_dict()))
            method = make_method("ado", ["learn", "noise", "slow"], [1, 1, 1], {})
            method.load_state_dict(state)
        out.append(on_grid(method.update(curves(u, rng), [PER_STRETCH] * 3), 0.02))
    return out


def test_noise_loses_half_its_weight_within_the_first_stretches_and_learnable_gains():
    weights = [[float(Fraction(w)) for w in ws] for ws in run(10)]
    start = 1 / 3
    assert weights[1] == pytest.approx([start] * 3, abs=1e-3)  # warmup: 3 points before a fit
    assert weights[3][1] < start / 2  # the fourth update: the noise below half its start
    assert weights[3][0] > start and weights[-1][0] > start  # the falling power law gains
    assert max(w[1] for w in weights[3:]) < start / 2 and weights[-1][1] < 0.1


def test_the_same_inputs_give_the_same_weights_bit_for_bit_and_after_a_resume():
    first = run(14)
    assert run(14) == first
    assert run(14, resume_at=5) == first
    assert len(set(first)) > 3
    method = make_method("ado", ["a", "b"], [1, 1], {})
    for u in range(4):
        method.update([2 / (u + 1), 1.0], [8, 8])
    state = method.state_dict()
    assert json.loads(json.dumps(state)) == state  # plain JSON
    assert state["params"][0] is not None and state["params"][0][1] > 0  # the fitted β
    assert state["trust"][0] > 0.9 and state["trust"][1] == 0  # a clean fall; a flat loss


def test_without_counts_a_dataset_counts_its_weight_per_stretch():
    method = make_method("ado", ["a", "b"], [3, 1], {})
    method.update([2.0, 1.0])
    assert method.seen == [0.75, 0.25]


# --- loss_ratio's rule 2 and its version -----------------------------------------------------


def rule_one(weights: list[float], inputs: list[list[float | None]], previous, step=0.5, base=0.01):
    """Rule 1 as it was written before the rule was versioned: the fall since the previous update."""
    out = []
    for losses in inputs:
        progress = []
        for d, loss in enumerate(losses):
            before = previous[d]
            fell = 0.0 if loss is None or before is None else max(0.0, before - loss)
            progress.append(fell + base)
            if loss is not None:
                previous[d] = loss
        total = sum(progress)
        weights = [(1 - step) * w + step * p / total for w, p in zip(weights, progress)]
        out.append(list(weights))
    return out


def test_loss_ratio_gives_a_flat_noisy_loss_nothing_and_a_steady_fall_its_weight():
    rng = random.Random(4)
    method = make_method("loss_ratio", ["noise", "learn"], [1, 1], {})
    for u in range(12):
        noise = round((5 + rng.gauss(0, 0.1)) / 0.01) * 0.01
        weights = method.update([noise, 3 * 0.9**u])
    assert weights[0] < 0.1 and weights[1] > 0.9


def test_a_loss_ratio_state_without_its_rule_resumes_with_rule_1():
    rng = random.Random(9)
    inputs = [[rng.choice([None, rng.uniform(4, 6)]), rng.uniform(1, 3)] for _ in range(12)]
    method = make_method("loss_ratio", ["a", "b"], [1, 1], {})
    old = {"weights": [0.6, 0.4], "previous": [5.0, None]}  # as rule 1 saved it
    method.load_state_dict(old)
    got = []
    for i, losses in enumerate(inputs):
        if i == 6:  # saved again (now with its rule) and resumed: still rule 1
            state = json.loads(json.dumps(method.state_dict()))
            assert state["rule"] == 1
            method = make_method("loss_ratio", ["a", "b"], [1, 1], {})
            method.load_state_dict(state)
        got.append(method.update(losses))
    assert got == rule_one([0.6, 0.4], inputs, [5.0, None])
    fresh = make_method("loss_ratio", ["a", "b"], [1, 1], {})
    assert fresh.state_dict()["rule"] == 2
    fresh.load_state_dict({"weights": [0.6, 0.4], "previous": [5.0, None]})
    assert [fresh.update(x) for x in inputs] == got
    new = make_method("loss_ratio", ["a", "b"], [1, 1], {})
    new.load_state_dict({**new.state_dict(), "weights": [0.6, 0.4]})
    assert [new.update(x) for x in inputs] != got  # rule 2 decides otherwise


def test_ado_rule_2_fits_as_rule_1_did_and_a_state_without_its_rule_resumes_with_rule_1():
    rng = random.Random(5)
    ns = [PER_STRETCH * (i + 0.5) for i in range(32)]
    losses = [round((2 + 3 * n**-0.3 + rng.gauss(0, 0.01)) / 0.001) * 0.001 for n in ns]
    assert fit(ns, losses, 2) == pytest.approx(fit(ns, losses, 1), rel=1e-4)
    inputs = [curves(u, rng) for u in range(12)]

    def weights(state_at: int | None, drop_rule: bool) -> list[list[float]]:
        method = make_method("ado", ["learn", "noise", "slow"], [1, 1, 1], {})
        method.rule = 1  # as the method fitted before its rule was versioned
        out = []
        for u, losses in enumerate(inputs):
            if u == state_at:
                state = json.loads(json.dumps(method.state_dict()))
                if drop_rule:  # a state saved before the rule was versioned
                    del state["rule"]
                method = make_method("ado", ["learn", "noise", "slow"], [1, 1, 1], {})
                assert method.state_dict()["rule"] == 2
                method.load_state_dict(state)
            out.append(method.update(losses, [PER_STRETCH] * 3))
        return out

    rule_one = weights(None, False)
    assert weights(6, True) == rule_one
    fresh = make_method("ado", ["learn", "noise", "slow"], [1, 1, 1], {})
    assert [fresh.update(x, [PER_STRETCH] * 3) for x in inputs] != rule_one  # rule 2 differs


def test_rule_2_credits_a_fall_by_the_share_of_samples_that_made_it():
    """Two datasets whose losses fall alike per update, one drawn 9 times as often: per own sample
    the rare one seems to fall 9 times as fast (its fall came from the others' samples), which rule
    1 rewards; rule 2 weighs each by its share of the samples, and keeps them near even."""

    def weights(rule: int) -> list[float]:
        method = make_method("ado", ["often", "rare"], [1, 1], {})
        method.rule = rule
        for u in range(8):
            loss = round((1 + 3 * (u + 1) ** -0.5) / 0.001) * 0.001
            out = method.update([loss, loss], [58, 6])
        return out

    one, two = weights(1), weights(2)
    assert one[1] > 0.8  # rule 1: the rare dataset takes the weight
    assert abs(two[0] - two[1]) < 0.1


def test_rule_2_history_reaches_back_to_the_first_point_within_its_size():
    method = make_method("ado", ["a"], [1], {"points": 8})
    for u in range(40):
        method.update([1 + 3 * (u + 1) ** -0.5], [16])
        assert len(method.history[0]) <= 8
    assert method.history[0][0][0] == 8.0  # the first stretch's middle
    assert method.history[0][-1][0] == 16 * 39.5
