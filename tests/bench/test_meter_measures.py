"""meter_check.py's arithmetic (bench/gpu/meter_measures.py) on made-up numbers."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import meter_measures as measures


def test_overlapping_kernels_count_once_and_gaps_not_at_all():
    intervals = [(0.0, 1.0), (0.5, 1.5), (0.6, 0.7), (3.0, 4.0)]
    assert measures.union_seconds(intervals) == pytest.approx(2.5)
    assert measures.union_seconds([]) == 0.0


def test_nvml_samples_count_the_time_since_the_one_before():
    # Polled every ~0.5 s: 50 %, then 100 % for a second, then a 3 s gap (counted 1 s).
    samples = [(0, 10), (500_000, 50), (1_500_000, 100), (4_500_000, 20)]
    figure = measures.nvml_busy_seconds(samples)
    assert figure["busy_s"] == pytest.approx(0.25 + 1.0 + 0.2)
    assert measures.nvml_busy_seconds([(0, 10)])["busy_s"] is None


def test_a_bursts_span_counts_its_idle_moments_and_not_the_gaps_between_bursts():
    # Two kernels 0.2 ms apart (one burst: 1.2 ms), then 5 ms idle, then one of 0.5 ms.
    intervals = [(0.0, 0.0005), (0.0007, 0.0012), (0.0062, 0.0067)]
    assert measures.burst_spans_seconds(intervals) == pytest.approx(0.0012 + 0.0005)
    assert measures.burst_spans_seconds([]) == 0.0


def test_the_table_marks_a_meter_off_by_more_than_five_percent():
    run = {
        "meter_s": 10.6,
        "profiler": {"busy_s": 10.0, "kernels_s": 10.2, "spans_s": 10.5},
        "nvml": {"busy_s": 10.4},
    }
    row = measures.table({"trainer": run}).splitlines()[-1]
    assert row == "| trainer | 10.60 | 10.00 (10.50) | 10.40 | 1.060 ! | 1.010 | 1.019 |"
