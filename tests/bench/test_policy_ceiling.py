"""bench/policy_ceiling.py: the most any policy can give a mix's worst client."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
from policy_ceiling import ceiling, fitting_sets, smallest_push_out

GIB = 1 << 30


def test_clients_that_fit_together_can_all_have_their_ideal():
    sets = fitting_sets([10 * GIB] * 4, 80 * GIB)
    assert sets == [(0, 1, 2, 3)]
    lower, upper = ceiling([0.25] * 4, [0.4] * 4, sets)
    assert upper == 1.0 and lower >= 0.99


def test_one_at_a_time_the_gpu_idles_in_each_ones_host_time():
    # Alone, client i does at most b_i in its turns: lambda = 1 / sum(d_i / b_i).
    sets = fitting_sets([60 * GIB] * 3, 80 * GIB)
    assert sets == [(0,), (1,), (2,)]
    ideal, busy = [0.3, 0.3, 0.4], [0.5, 0.6, 0.8]
    lower, upper = ceiling(ideal, busy, sets)
    exact = 1 / sum(d / b for d, b in zip(ideal, busy))
    assert lower <= exact + 1e-9 and upper >= exact - 1e-9
    assert upper == pytest.approx(exact, abs=0.005)


def test_pairs_that_fit_overlap_their_bursts():
    # Three 30 GiB clients on 80 GiB: any two fit.  Each half busy wants a third of the
    # GPU: pairs (0,1), (1,2), (0,2) a third of the time each give each 1/3 -> lambda 1.
    sets = fitting_sets([30 * GIB] * 3, 80 * GIB)
    assert sorted(sets) == [(0, 1), (0, 2), (1, 2)]
    lower, upper = ceiling([1 / 3] * 3, [0.5] * 3, sets)
    assert upper == 1.0 and lower >= 0.97
    # A trainer beside two that each fit only beside it: it runs all the time, the others
    # in turns beside it.  Ideal: a half, a quarter, a quarter; each small one is busy a
    # third alone and does 1/3 x 1/2 of the time: lambda = (1/6) / (1/4) = 2/3.
    sets = fitting_sets([10 * GIB, 40 * GIB, 40 * GIB], 80 * GIB)
    assert sorted(sets) == [(0, 1), (0, 2)]
    lower, upper = ceiling([0.5, 0.25, 0.25], [1.0, 1 / 3, 1 / 3], sets)
    assert upper == pytest.approx(2 / 3, abs=0.005) and lower <= upper + 1e-9


def test_a_client_with_no_ideal_share_is_left_out():
    sets = fitting_sets([60 * GIB] * 2, 80 * GIB)
    assert ceiling([0.0, 0.5], [0.5, 1.0], sets)[1] == 1.0
    assert ceiling([0.0, 0.0], [0.5, 1.0], sets) == (1.0, 1.0)


def test_what_a_client_must_bring_back_is_what_the_other_pushes_out():
    # 60 + 60 GiB (and their contexts) on 80 GiB, 77.5 of it usable: 43.5 of either moves.
    assert smallest_push_out([60 * GIB, 60 * GIB], 80 * GIB, 0) == int(43.5 * GIB)
    assert smallest_push_out([10 * GIB, 10 * GIB], 80 * GIB, 0) is None  # they fit
