"""Analysis stage: records -> the paper's tables (2-13) and figures (3-5), the acceptance
analytics (tables acceptance and latency, Figures A1 and A2, acceptance profiles) and the
concurrency tables and Figure C1.

    python -m packedss.analysis RESULTS_DIR [--compare-paper] [--tables 6,10,acceptance,concurrency] [--figures 3,4,5,A1,A2,C1]

The definitions and outputs: docs/analysis.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from packedss.analysis.bootstrap import N_RESAMPLES, CI, Comparison, compare, paired_bootstrap
from packedss.analysis.compare import Comparisons
from packedss.analysis.load import Loaded, load_records
from packedss.analysis.metrics import aggregate, per_question, per_response

__all__ = [
    "CI",
    "Comparison",
    "Comparisons",
    "Loaded",
    "N_RESAMPLES",
    "Results",
    "aggregate",
    "analyse",
    "compare",
    "load_records",
    "load_results",
    "paired_bootstrap",
    "per_question",
    "per_response",
    "record_sources",
    "records_dir",
]


def records_dir(results_dir: str | Path) -> Path:
    """A results folder's records: `<results>/records` when it exists, else the folder itself."""
    results_dir = Path(results_dir)
    return results_dir / "records" if (results_dir / "records").is_dir() else results_dir


@dataclass
class Results:
    """A loaded results folder: the records, their per-response and per-question rows and the
    comparisons cache."""

    path: Path
    loaded: Loaded
    comparisons: Comparisons
    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # by default, the tables and figures without records
    removed: list[Path] = field(default_factory=list)  # an earlier analysis's files of what this one did not write

    @property
    def per_response(self):
        return self.comparisons.responses

    @property
    def per_question(self):
        return self.comparisons.pq


def record_sources(results_dir: str | Path, extra_records=()) -> list[Path]:
    """Where the records of an analysis come from: the results folder's records (its `records`
    folder, else the folder itself, when it exists) and any further record files or folders (a
    file reached through two of them is read once)."""
    sources = [Path(p) for p in extra_records]
    own = records_dir(results_dir)
    if own.exists():
        sources.insert(0, own)
    named: dict[Path, Path] = {}  # one entry per folder or file, however it is spelled
    for source in sources:
        named.setdefault(source.resolve(), source)
    return list(named.values())


def remove_earlier_files(directory: Path, stem: str, suffixes) -> list[Path]:
    """Remove the files an earlier analysis wrote of a table or figure (`stem`) that this one does
    not write by default: left in place, they would read as results of these records."""
    removed = []
    for path in ((directory / stem).with_suffix(suffix) for suffix in suffixes):
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed


def load_results(results_dir: str | Path, n_resamples: int = N_RESAMPLES, extra_records=()) -> Results:
    loaded = load_records(record_sources(results_dir, extra_records))
    return Results(Path(results_dir), loaded, Comparisons(per_response(loaded.frame), n_resamples))


def analyse(
    results_dir: str | Path,
    tables=None,
    figures=None,
    compare_paper: bool = False,
    n_resamples: int = N_RESAMPLES,
    out_dir: str | Path | None = None,
    extra_records=(),
) -> Results:
    """Write the requested tables (default: all, `acceptance` included, and `concurrency` when
    the records hold a run at two or more C with a Linear-SS run of its setting) and figures
    (default: all, C1 when a run was measured at two or more C) under `<out_dir or
    results_dir>/tables` and `/figures`; a table or figure asked for by name whose records are
    missing raises PackedSSError before anything is written, and by default one without records
    is not written but named in `Results.skipped`, and the files an earlier analysis wrote of it
    (or of the concurrency tables and C1 that these records do not make) are removed and listed
    in `Results.removed`; whenever tables are written, the per-run
    summary (`runs`, every run of every family) is written too, and with the acceptance table or
    Figure A1 or A2 each run's `acceptance/<model>/<task>/<record file>/acceptance_profile.json`.
    `extra_records`: further record files or folders to read besides `<results_dir>/records`
    (e.g. a figure drawn from several tables' runs)."""
    import matplotlib.pyplot as plt

    from packedss.analysis import concurrency
    from packedss.analysis.acceptance import acceptance_profiles, write_profiles
    from packedss.analysis.acceptance_tables import acceptance_table, latency_table
    from packedss.analysis.figures import ACCEPTANCE_FIGURES, FIGURE_SUFFIXES, FIGURES, make_figure, write_figure
    from packedss.analysis.measured_tables import runs_table
    from packedss.analysis.metrics import regime_labels, regime_note
    from packedss.analysis.render import TABLE_SUFFIXES, write_table
    from packedss.analysis.tables import ACCEPTANCE, CONCURRENCY, TABLES

    results = load_results(results_dir, n_resamples, extra_records)
    records, responses = results.loaded.frame, results.per_response
    out = Path(out_dir) if out_dir is not None else Path(results_dir)
    # Asked for by name, the concurrency table and figure need their records (an error otherwise);
    # by default they are written only when the records allow them.
    if tables is None:
        numbers = [*TABLES, ACCEPTANCE] + ([CONCURRENCY] if concurrency.problem(records, responses, "tables") is None else [])
    else:
        numbers = list(tables)
    if figures is None:
        allowed = concurrency.problem(records, responses, "figure") is None
        figure_keys = [key for key in FIGURES if key != concurrency.FIGURE or allowed]
    else:
        figure_keys = list(figures)
    if CONCURRENCY in numbers:
        concurrency.check(records, responses, "tables")
    if concurrency.FIGURE in figure_keys:
        concurrency.check(records, responses, "figure")
    regime = regime_note(records)
    # The CSVs' own regime column: how the analysed runs were measured (the notes' labels).
    measured_in = " | ".join(regime_labels(records))

    def write(table) -> None:
        if table.measured:
            table.notes.append(regime)
            table.data = table.data.assign(measured_in=measured_in)
        if table.measured or tables is not None:  # asked for by name, written with its note
            results.written += write_table(table, out / "tables")
        else:
            results.skipped.append(table.stem)
            results.removed += remove_earlier_files(out / "tables", table.stem, TABLE_SUFFIXES)

    # By default the concurrency tables and Figure C1 are not made from records that cannot make them.
    if tables is None and CONCURRENCY not in numbers:
        for stem in (CONCURRENCY, concurrency.CROSSOVER):
            results.removed += remove_earlier_files(out / "tables", stem, TABLE_SUFFIXES)
    if figures is None and concurrency.FIGURE not in figure_keys:
        results.removed += remove_earlier_files(out / "figures", f"figure{concurrency.FIGURE}", FIGURE_SUFFIXES)

    if numbers:
        write(runs_table(results.per_question, results.comparisons))
    profiles = None
    if ACCEPTANCE in numbers or any(key in ACCEPTANCE_FIGURES for key in figure_keys):
        profiles = acceptance_profiles(results.per_response, n_resamples)
        results.written += write_profiles(profiles, out / "acceptance")
    for number in numbers:
        if number == ACCEPTANCE:
            write(acceptance_table(profiles))
            write(latency_table(results.loaded.frame))
            continue
        if number == CONCURRENCY:
            for table in concurrency.concurrency_tables(records, responses, n_resamples):
                write(table)
            continue
        write(TABLES[number].function(results.per_question, results.comparisons, compare_paper))
    for number in figure_keys:
        figure = make_figure(number, results.comparisons, profiles, records)
        if figure.data.empty and figures is None:
            results.skipped.append(f"figure{number}")
            results.removed += remove_earlier_files(out / "figures", f"figure{number}", FIGURE_SUFFIXES)
            plt.close(figure.figure)
        else:
            figure.data = figure.data.assign(measured_in=measured_in)
            results.written += write_figure(figure, out / "figures")
    return results
