"""Analysis stage: records -> the paper's tables (2-13) and figures (3-5), the acceptance
analytics (tables acceptance and latency, Figures A1 and A2, acceptance profiles) and the
concurrency tables and Figure C1.

    python -m packedss.analysis RESULTS_DIR [--compare-paper] [--tables 6,10,acceptance,concurrency] [--figures 3,4,5,A1,A2,C1]

The definitions and outputs: docs/analysis.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from packedss.analysis.bootstrap import N_RESAMPLES, CI, Comparison, compare, paired_bootstrap
from packedss.analysis.compare import Comparisons
from packedss.analysis.load import Loaded, load_records
from packedss.analysis.metrics import aggregate, per_question, per_response
from packedss.errors import PackedSSError
from packedss.paths import PROJECT_ROOT

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
    "results_dir_from_start",
    "skipped_line",
    "write_analysis",
]


def records_dir(results_dir: str | Path) -> Path:
    """A results folder's records: `<results>/records` when it exists, else the folder itself."""
    results_dir = Path(results_dir)
    return results_dir / "records" if (results_dir / "records").is_dir() else results_dir


def results_dir_from_start(path: str | Path, environ=None, cwd: Path | None = None) -> Path:
    """A results folder named where a command was started. A notebook's kernel runs in the
    notebook's folder (`jupyter execute`, Jupyter, editors), not where the command was typed, so a
    relative path is tried, in this order, under $PWD (the directory the shell started the command
    in, which the kernel inherits), the repository root (where the README's commands run) and the
    working directory; the first where it exists is taken. Raises PackedSSError when none is."""
    path = Path(path).expanduser()
    if path.is_absolute():
        if not path.is_dir():
            raise PackedSSError(f"no results folder {path}; name a folder that holds records (or RESULTS_DIR/records)")
        return path
    environ = os.environ if environ is None else environ
    starts = [Path(environ["PWD"])] if environ.get("PWD") else []
    starts += [PROJECT_ROOT, Path.cwd() if cwd is None else cwd]
    tried = list(dict.fromkeys((start / path).absolute() for start in starts))
    for candidate in tried:
        if candidate.is_dir():
            return candidate
    raise PackedSSError(f"no results folder {path} (looked for {', '.join(map(str, tried))}); "
                        "name it relative to where you run the command, or give an absolute path")  # fmt: skip


def skipped_line(skipped: list[str], removed: list[Path]) -> str | None:
    """One line on what a default analysis did not write and why, and which files an earlier
    analysis wrote of such tables and figures it removed."""
    parts = []
    if skipped:
        parts.append(f"skipped {', '.join(skipped)}: no records of their settings (name one in --tables or --figures to write it anyway)")
    if removed:
        stems = ", ".join(dict.fromkeys(path.stem for path in removed))
        parts.append(f"removed the earlier files of {stems}, which these records do not make")
    return "; ".join(parts) or None


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


@dataclass
class Outputs:
    """What one analysis writes: its table and figure keys, and whether each kind was named (not
    named: the ones the records fill are written, the rest skipped and their earlier files removed)."""

    tables: list
    figures: list
    named_tables: bool
    named_figures: bool


def chosen_outputs(results: Results, tables=None, figures=None) -> Outputs:
    """The tables and figures to write. Asked for by name, the concurrency tables and Figure C1
    need their records (PackedSSError otherwise, before anything is written); by default they are
    chosen only when the records make them."""
    from packedss.analysis import concurrency
    from packedss.analysis.figures import FIGURES
    from packedss.analysis.tables import ACCEPTANCE, CONCURRENCY, TABLES

    records, responses = results.loaded.frame, results.per_response
    if tables is None:
        makes_concurrency = concurrency.problem(records, responses, "tables") is None
        table_keys = [*TABLES, ACCEPTANCE] + ([CONCURRENCY] if makes_concurrency else [])
    else:
        table_keys = list(tables)
    if figures is None:
        makes_c1 = concurrency.problem(records, responses, "figure") is None
        figure_keys = [key for key in FIGURES if key != concurrency.FIGURE or makes_c1]
    else:
        figure_keys = list(figures)
    if CONCURRENCY in table_keys:
        concurrency.check(records, responses, "tables")
    if concurrency.FIGURE in figure_keys:
        concurrency.check(records, responses, "figure")
    return Outputs(table_keys, figure_keys, tables is not None, figures is not None)


def remove_unmade_concurrency_files(results: Results, outputs: Outputs, out: Path) -> None:
    """By default, the concurrency tables and Figure C1 an earlier analysis wrote are removed when
    these records do not make them."""
    from packedss.analysis import concurrency
    from packedss.analysis.figures import FIGURE_SUFFIXES
    from packedss.analysis.render import TABLE_SUFFIXES

    if not outputs.named_tables and concurrency.CONCURRENCY not in outputs.tables:
        for stem in (concurrency.CONCURRENCY, concurrency.CROSSOVER):
            results.removed += remove_earlier_files(out / "tables", stem, TABLE_SUFFIXES)
    if not outputs.named_figures and concurrency.FIGURE not in outputs.figures:
        results.removed += remove_earlier_files(out / "figures", f"figure{concurrency.FIGURE}", FIGURE_SUFFIXES)


def measured_in(results: Results) -> str:
    """The CSVs' regime column: how the analysed runs were measured (the notes' labels)."""
    from packedss.analysis.metrics import regime_labels

    return " | ".join(regime_labels(results.loaded.frame))


def write_acceptance_profiles(results: Results, outputs: Outputs, out: Path) -> list[dict] | None:
    """Each run's acceptance profile, computed and written under `out/acceptance` when the
    acceptance table or Figure A1 or A2 is written (None otherwise)."""
    from packedss.analysis.acceptance import acceptance_profiles, write_profiles
    from packedss.analysis.figures import ACCEPTANCE_FIGURES
    from packedss.analysis.tables import ACCEPTANCE

    if ACCEPTANCE not in outputs.tables and not any(key in ACCEPTANCE_FIGURES for key in outputs.figures):
        return None
    profiles = acceptance_profiles(results.per_response, results.comparisons.n_resamples)
    results.written += write_profiles(profiles, out / "acceptance")
    return profiles


def write_measured_table(results: Results, table, named: bool, out: Path) -> None:
    """Write a table under `out/tables` with the regime note and column; a table whose runs are
    not in the records is written only when named, and otherwise skipped, its earlier files removed."""
    from packedss.analysis.metrics import regime_note
    from packedss.analysis.render import TABLE_SUFFIXES, write_table

    if table.measured:
        table.notes.append(regime_note(results.loaded.frame))
        table.data = table.data.assign(measured_in=measured_in(results))
    if table.measured or named:  # asked for by name, written with its note
        results.written += write_table(table, out / "tables")
    else:
        results.skipped.append(table.stem)
        results.removed += remove_earlier_files(out / "tables", table.stem, TABLE_SUFFIXES)


def write_run_summary(results: Results, outputs: Outputs, out: Path) -> None:
    """The per-run summary (`runs`, every run of every family), whenever any table is written."""
    from packedss.analysis.measured_tables import runs_table

    if outputs.tables:
        write_measured_table(results, runs_table(results.per_question, results.comparisons), outputs.named_tables, out)


def write_tables(results: Results, outputs: Outputs, out: Path, compare_paper: bool = False, profiles: list[dict] | None = None) -> None:
    """Each table of `outputs.tables` in order (`acceptance`: the tables acceptance and latency;
    `concurrency`: concurrency and crossover)."""
    from packedss.analysis import concurrency
    from packedss.analysis.acceptance_tables import acceptance_table, latency_table
    from packedss.analysis.tables import ACCEPTANCE, CONCURRENCY, TABLES

    for key in outputs.tables:
        if key == ACCEPTANCE:
            made = [acceptance_table(profiles), latency_table(results.loaded.frame)]
        elif key == CONCURRENCY:
            made = concurrency.concurrency_tables(results.loaded.frame, results.per_response, results.comparisons.n_resamples)
        else:
            made = [TABLES[key].function(results.per_question, results.comparisons, compare_paper)]
        for table in made:
            write_measured_table(results, table, outputs.named_tables, out)


def write_figures(results: Results, outputs: Outputs, out: Path, profiles: list[dict] | None = None) -> None:
    """Draw and write each figure under `out/figures` (PNG, PDF, and its numbers as CSV with the
    regime column); by default a figure with no data is not written, and its earlier files are
    removed."""
    import matplotlib.pyplot as plt

    from packedss.analysis.figures import FIGURE_SUFFIXES, make_figure, write_figure

    column = measured_in(results)
    for key in outputs.figures:
        figure = make_figure(key, results.comparisons, profiles, results.loaded.frame)
        if figure.data.empty and not outputs.named_figures:
            results.skipped.append(f"figure{key}")
            results.removed += remove_earlier_files(out / "figures", f"figure{key}", FIGURE_SUFFIXES)
            plt.close(figure.figure)
            continue
        figure.data = figure.data.assign(measured_in=column)
        results.written += write_figure(figure, out / "figures")


def write_analysis(results: Results, out: str | Path, tables=None, figures=None, compare_paper: bool = False) -> Results:
    """`analyse`'s steps on loaded results, writing under `out`."""
    out = Path(out)
    outputs = chosen_outputs(results, tables, figures)
    remove_unmade_concurrency_files(results, outputs, out)
    write_run_summary(results, outputs, out)
    profiles = write_acceptance_profiles(results, outputs, out)
    write_tables(results, outputs, out, compare_paper, profiles)
    write_figures(results, outputs, out, profiles)
    return results


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
    results = load_results(results_dir, n_resamples, extra_records)
    return write_analysis(results, out_dir if out_dir is not None else results_dir, tables, figures, compare_paper)
