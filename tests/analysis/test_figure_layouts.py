"""The figures' layouts, measured on the drawn figures' text and legend boxes (not their pixels):
no tick labels drawn over each other, no legend over the bars."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.transforms import Bbox

from packedss.analysis import load_results
from packedss.analysis.figures import make_figure
from tests.analysis.conftest import N_RESAMPLES
from tests.analysis.synthetic import make_record, write_records


def overlapping_tick_labels(figure) -> list[tuple[str, str]]:
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    overlaps = []
    for ax in figure.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in labels]
        overlaps += [(labels[i].get_text(), labels[j].get_text()) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                     if boxes[i].overlaps(boxes[j])]  # fmt: skip
    return overlaps


@pytest.fixture(scope="module")
def two_widths(tmp_path_factory):
    """Nemotron's schedules at W = 8 and 16, as a sweep `width=8,16` leaves them: Figure 5 has two
    bars of each speculative schedule side by side."""
    folder = tmp_path_factory.mktemp("two-widths")
    records = [make_record(schedule="ar", width=8, question=q, tokens_per_iteration=1) for q in range(4)]
    records += [make_record(schedule=schedule, width=width, question=q, tokens_per_iteration=3 if width == 8 else 5)
                for schedule in ("linear", "quadratic", "packed") for width in (8, 16) for q in range(4)]  # fmt: skip
    write_records(folder / "records", records)
    return load_results(folder, n_resamples=N_RESAMPLES)


def test_figure5_with_two_widths_draws_its_schedule_labels_apart(two_widths):
    figure = make_figure(5, two_widths.comparisons).figure
    labels = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert {"Quadratic-SS\nB=9", "Quadratic-SS\nB=17", "Packed-SS\nB=9", "Packed-SS\nB=17"} <= set(labels)
    assert overlapping_tick_labels(figure) == []


def test_the_ratio_figures_draw_their_setting_labels_apart(results_dir):
    comparisons = load_results(results_dir, n_resamples=N_RESAMPLES).comparisons
    for number in (3, 4):
        figure = make_figure(number, comparisons).figure
        assert len([t for t in figure.axes[-1].get_xticklabels() if t.get_text()]) >= 2
        assert overlapping_tick_labels(figure) == [], number


def bar_boxes(ax, bars) -> list[Bbox]:
    """The display boxes of A2's bars (bin k: k - 0.5 to k + 0.5, from the axis' bottom to its share)."""
    bottom = ax.get_ylim()[0]
    boxes = []
    for tokens, share in bars:
        corners = ax.transData.transform([(tokens - 0.5, bottom), (tokens + 0.5, share)])
        boxes.append(Bbox(corners))
    return boxes


def test_figure_a2_legends_cover_no_bar(results_dir):
    """Every panel, the W = 8 ones with three runs and the any-order ones with seven included."""
    figure = make_figure("A2", load_results(results_dir, n_resamples=N_RESAMPLES).comparisons)
    figure.figure.canvas.draw()
    renderer = figure.figure.canvas.get_renderer()
    panels = {ax.get_title(): ax for ax in figure.figure.axes if ax.get_title()}
    legends = [ax.get_legend() for ax in figure.figure.axes if ax.get_legend() is not None]
    assert len(legends) == len(panels) >= 12
    assert max(len(legend.get_texts()) for legend in legends) == 7
    bars = []
    for title, rows in figure.data[figure.data["share"] > 0].groupby("panel"):
        assert title in panels
        bars += bar_boxes(panels[title], zip(rows["tokens"], rows["share"], strict=True))
    assert any("W=8" in title for title in panels) and len(bars) > 20
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert np.isfinite(box.bounds).all()
        assert not [bar for bar in bars if bar.overlaps(box)], [t.get_text() for t in legend.get_texts()]
        assert not [ax for ax in panels.values() if ax.get_window_extent(renderer).overlaps(box)]  # nor any panel's plot
