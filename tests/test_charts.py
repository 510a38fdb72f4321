"""The dashboard's figures are pure functions: hand-made records in, plotly figures out."""

import numpy as np
import pytest

from dataloader_tuner.dashboard import charts
from dataloader_tuner.analyse import metrics

from .records import make_batches


def _points(fig) -> int:
    return sum(len(trace.x) for trace in fig.data if trace.x is not None)


def test_batch_latency_plots_every_batch_after_warmup_and_a_histogram():
    batches = make_batches(100)
    fig = charts.batch_latency_figure(batches, warmup=4)
    assert "Batch latency" in fig.layout.title.text
    scatter, start_up, histogram = fig.data
    assert len(scatter.x) == 96
    assert histogram.y.sum() == 96  # every measured batch lands in the distribution
    assert fig.layout.shapes[0].x0 == pytest.approx(batches[3].t_ready)  # warm-up marker
    assert list(start_up.customdata) == [0]  # the run's first batch opened its one epoch


def test_each_epochs_start_up_is_marked_on_the_latency_chart():
    batches = [b._replace(epoch=b.seq // 25, wait_s=0.3 if b.seq % 25 == 0 else b.wait_s)
               for b in make_batches(100)]
    start_up = next(t for t in charts.batch_latency_figure(batches, warmup=4).data
                    if t.name.startswith("epoch start-up"))
    assert list(start_up.customdata) == [0, 1, 2, 3]  # the warm-up's epoch included
    assert list(start_up.y) == pytest.approx([300.0] * 4)


def test_long_runs_are_binned_but_keep_their_spikes():
    batches = make_batches(5000)
    spike = batches[2500]._replace(wait_s=0.5)
    batches[2500] = spike
    fig = charts.batch_latency_figure(batches)
    median, maxima = fig.data[0], fig.data[1]
    assert len(median.x) <= charts.MAX_POINTS
    assert max(maxima.y) == pytest.approx(500.0)
    assert max(median.y) < 10.0


def test_binned_returns_points_unchanged_when_few():
    x, y, maxima = charts.binned([0.0, 1.0, 2.0], [5.0, 6.0, 7.0])
    assert list(y) == [5.0, 6.0, 7.0] and maxima is None


def test_binned_medians_are_each_bin_s_own():
    """Bins of odd and even sizes, uneven x with ties: each bin's median and middle, as a
    median taken bin by bin says."""
    rng = np.random.default_rng(7)
    x = np.sort(rng.random(5003) ** 2 * 100)
    x[10:60] = x[10]
    y = rng.exponential(size=len(x))
    centers, medians, maxima = charts.binned(x, y, max_points=100)
    edges = np.linspace(x[0], x[-1], 51)
    starts = np.unique(np.searchsorted(x, edges[:-1]))
    ends = np.append(starts[1:], len(x))
    assert {int(n) % 2 for n in ends - starts} == {0, 1}
    assert medians == pytest.approx([np.median(y[a:b]) for a, b in zip(starts, ends)])
    assert centers == pytest.approx([(x[a] + x[b - 1]) / 2 for a, b in zip(starts, ends)])
    assert maxima == pytest.approx([y[a:b].max() for a, b in zip(starts, ends)])


def test_worker_utilization_has_a_line_per_worker():
    batches = make_batches(200, workers=3)
    rows = metrics.busy_timeline(batches, end=2.0, window_s=0.5)
    fig = charts.worker_utilization_figure(rows)
    assert "Worker utilization" in fig.layout.title.text
    assert [t.name for t in fig.data] == ["worker 0", "worker 1", "worker 2"]
    assert all(0 <= v <= 100 for t in fig.data for v in t.y)


def test_worker_timeline_splits_fetch_and_collate_for_recent_batches():
    batches = make_batches(500, workers=2)
    fig = charts.worker_timeline_figure(batches, last_n=100, last_s=60.0)
    collate, fetch = fig.data
    assert "Worker utilization" in fig.layout.title.text
    assert len(fetch.x) == len(collate.x) == 100
    assert set(fetch.y) == {"worker 0", "worker 1"}
    assert fetch.x[0] == pytest.approx(15.0) and collate.x[0] == pytest.approx(1.0)
    assert collate.base[0] == pytest.approx(fetch.base[0] + fetch.x[0])


def test_worker_timeline_keeps_to_the_last_seconds():
    batches = make_batches(500, workers=2, period_s=0.01)  # 5 s of batches
    fig = charts.worker_timeline_figure(batches, last_n=1000, last_s=1.0)
    assert 95 <= len(fig.data[0].x) <= 105


def test_transfer_figure_only_when_copies_were_timed():
    assert charts.transfer_figure(make_batches(10), pin_memory=True) is None
    fig = charts.transfer_figure(make_batches(10, h2d_ms=0.5), pin_memory=True)
    assert "Pinned-memory transfer" in fig.layout.title.text
    assert fig.data[0].name.startswith("pinned") and fig.data[1].name.startswith("pageable")


def test_idle_gaps_say_which_gaps_they_show():
    gpu = charts.idle_gaps_figure(make_batches(10, gpu_gap_ms=3.0), gpu_measured=True)
    assert gpu.layout.title.text.startswith("GPU idle gaps:")
    assert list(gpu.data[0].y) == [3.0] * 10
    cpu = charts.idle_gaps_figure(make_batches(10), gpu_measured=False)
    assert "GPU idle gaps" in cpu.layout.title.text and "consumer" in cpu.layout.title.text
    assert list(cpu.data[0].y) == pytest.approx([2.0] * 10)


def test_tune_figure_marks_the_recommendation_and_the_current_settings():
    trials = [{"num_workers": 0, "samples_per_s": 100.0, "phase": "probe"},
              {"num_workers": 2, "samples_per_s": 300.0, "phase": "search"},
              {"num_workers": 2, "samples_per_s": 320.0, "phase": "confirm"},
              {"num_workers": 0, "samples_per_s": 110.0, "phase": "baseline"}]
    fig = charts.tune_figure(trials, recommended_workers=2)
    names = [t.name for t in fig.data]
    assert names == ["trial", "median per setting", "current settings", "recommended"]
    assert list(fig.data[1].y) == [100.0, 310.0]
    assert fig.data[3].y[0] == pytest.approx(310.0)


def test_throughput_over_time_leaves_out_the_unfinished_window():
    batches = make_batches(250, period_s=0.01)  # 8 samples every 10 ms = 800 samples/s
    x, y = charts.throughput_over_time(batches, bin_s=0.5)
    assert len(x) == 4  # 2.5 s of arrivals: four full windows, the fifth is partial
    assert np.allclose(y[1:], 800.0)


def test_compare_figures_overlay_one_trace_per_run():
    runs = [("a", make_batches(100)), ("b", make_batches(100, wait_s=0.004))]
    assert [t.name for t in charts.compare_throughput_figure(runs).data] == ["a", "b"]
    cdf = charts.compare_latency_figure([(label, b, 1) for label, b in runs])
    assert cdf.data[0].y[-1] == pytest.approx(1.0)
    assert cdf.data[1].x[0] > cdf.data[0].x[0]


def test_throughput_of_bursty_rounds_is_not_a_sawtooth():
    """4 workers delivering a round of 4 batches every 0.4 s: short bins would alternate
    between 0 and twice the rate; the default bins hold whole rounds."""
    batches = []
    for i in range(48):
        t = (i // 4) * 0.4 + (i % 4) * 0.001
        batches.append(make_batches(1)[0]._replace(seq=i, t_request=t, wait_s=0.0,
                                                   worker_id=i % 4))
    _, y = charts.throughput_over_time(batches)
    assert min(y) > 0.5 * max(y), y  # 8 samples x 4 per 0.4 s = 80 samples/s throughout


def test_headline_figures_fit_a_narrow_tile():
    from dataloader_tuner.dashboard.views import compact

    assert [compact(v) for v in (377.07, 12345.6, 2.5e6, 0.1234, None)] == [
        "377", "12.3k", "2.50M", "0.123", "n/a"]


def test_the_icicle_holds_each_stage_and_its_functions():
    flame = [{"stage": "decode", "function": "ImageFile.load (ImageFile.py:296)", "share": 0.5},
             {"stage": "decode", "function": "other", "share": 0.1},
             {"stage": "collate", "function": "default_collate (collate.py:1)", "share": 0.4}]
    icicle = charts.where_time_goes_figure(flame).data[0]
    by_id = dict(zip(icicle.ids, icicle.values))
    assert by_id["decode"] == pytest.approx(0.6) and by_id["collate"] == pytest.approx(0.4)
    assert dict(zip(icicle.ids, icicle.parents))["decode/other"] == "decode"


def test_what_if_chart_puts_the_largest_gain_on_top_against_the_measured_rate():
    rows = [{"change": "8 usable CPUs", "predicted_samples_per_s": 6800.0, "predicted_gain": 4.2,
             "then_binding": "cpu"},
            {"change": "decode gone", "predicted_samples_per_s": 3000.0, "predicted_gain": 1.8,
             "then_binding": "main_process"}]
    figure = charts.what_if_figure(rows, measured=1640.0)
    bar = figure.data[0]
    assert list(bar.y) == ["decode gone", "8 usable CPUs"]  # drawn bottom up: largest on top
    assert list(bar.x) == [3000.0, 6800.0] and "then main process" in bar.text[0]
    assert figure.layout.shapes[0].x0 == 1640.0  # the measured rate, dashed
    cached = {"change": "every sample cached in RAM", "predicted_samples_per_s": 9000.0,
              "predicted_gain": 5.5, "then_binding": "", "measured_samples_per_s": 12000.0}
    bar = charts.what_if_figure([cached, *rows], measured=1640.0).data[0]
    assert bar.x[-1] == 12000.0 and bar.text[-1] == "measured"  # the measured rate, filled
