"""python -m packedss.analysis RESULTS_DIR [--compare-paper] [--tables 6,10,sdar,acceptance,concurrency] [--figures 3,4,5,A1,A2,C1]

Reads every JSONL record under RESULTS_DIR/records (or RESULTS_DIR), reports bad lines with file
and line number, and writes tables under RESULTS_DIR/tables and figures under
RESULTS_DIR/figures. Without --tables/--figures it writes all of them; with only one of the two
options, only what that option names. With any table it also writes runs.csv/.md/.tex, one row
per run of every model family in the records."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from packedss.analysis import N_RESAMPLES, analyse, audit, record_sources, skipped_line
from packedss.analysis.figures import FIGURES
from packedss.analysis.load import find_record_files
from packedss.analysis.tables import ACCEPTANCE, CONCURRENCY, TABLES
from packedss.errors import ArgumentParser, PackedSSError, closest, run_cli, run_reporting
from packedss.records import BadLine, iter_lines, validate_record


EVERYTHING = "all"


def _numbers(text: str, valid, what: str) -> list | str:
    """Comma-separated table or figure keys: numbers, or names such as acceptance and A1;
    EVERYTHING for `all` (every one the records allow, as without the option)."""
    if text.strip().lower() in ("", "none"):
        return []
    if text.strip().lower() == "all":
        return EVERYTHING
    by_name = {str(v).lower(): v for v in valid}
    parts = [part.strip().lower() for part in text.split(",") if part.strip()]
    bad = [part for part in parts if part not in by_name]
    if bad:
        guess = closest(bad[0], by_name) if len(bad) == 1 and not bad[0].isdigit() else ""  # a name's typo
        raise argparse.ArgumentTypeError(f"no {what} {', '.join(bad)}{guess}; valid: {', '.join(map(str, valid))}")
    return [by_name[part] for part in parts]


def check_records(sources: list[Path]) -> None:
    """At least one usable record among the sources, before any table or figure folder is made.
    Reads up to the first sound record (all of them only when there is none)."""
    bad: list[BadLine] = []
    for path in find_record_files(sources):
        for number, record, error in iter_lines(path):
            problems = [error] if record is None else validate_record(record)
            if not problems and not record.get("warmup"):
                return
            if problems:
                bad.append(BadLine(path, number, "; ".join(problems)))
    where = ", ".join(map(str, sources))
    skipped = f" ({len(bad)} bad lines, the first {bad[0]})" if bad else ""
    raise PackedSSError(f"no usable records under {where}{skipped}; run the jobs first (python run.py ... out_dir=RESULTS_DIR/records)")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m packedss.analysis", description=__doc__.split("\n\n")[1])
    parser.add_argument("results_dir", help="results folder (records under RESULTS_DIR/records or RESULTS_DIR)")
    parser.add_argument("--tables", type=lambda t: _numbers(t, [*TABLES, ACCEPTANCE, CONCURRENCY], "table"), default=None,
                        help="e.g. 6,10, sdar, acceptance or concurrency (default: all, 2-13, sdar, acceptance, and concurrency when runs were measured at several C)")
    parser.add_argument("--figures", type=lambda t: _numbers(t, FIGURES, "figure"), default=None,
                        help="e.g. 3,5, A1,A2 or C1 (default: all, 3-5, A1, A2, and C1 when runs were measured at several C)")
    parser.add_argument("--compare-paper", action="store_true", help="show the paper's published numbers beside the measured ones")
    parser.add_argument("--n-resamples", type=int, default=N_RESAMPLES, help=f"bootstrap resamples (default {N_RESAMPLES})")
    parser.add_argument("--out", default=None, help="write tables/ and figures/ here instead of RESULTS_DIR")
    parser.add_argument("--records", nargs="+", default=[], metavar="PATH", help="further record files or folders to read (e.g. other tables' runs)")
    parser.add_argument("--strict", action="store_true", help="exit 3 when the divergence audit finds an unexplained divergence")
    args = parser.parse_args(argv)
    if args.n_resamples < 1:
        parser.error(f"invalid --n-resamples {args.n_resamples}: must be >= 1")
    return run_reporting(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    tables, figures = args.tables, args.figures
    if tables is not None and figures is None:
        figures = []
    if figures is not None and tables is None:
        tables = []
    sources = record_sources(args.results_dir, args.records)
    missing = [str(p) for p in sources if not p.exists()]
    if not sources or missing:
        raise PackedSSError(f"no records folder {', '.join(missing) or args.results_dir}; name a results folder or records files")
    check_records(sources)
    source = ", ".join(map(str, sources))
    start = time.perf_counter()
    tables, figures = (None if keys == EVERYTHING else keys for keys in (tables, figures))
    results = analyse(args.results_dir, tables, figures, args.compare_paper, args.n_resamples, args.out, args.records)
    loaded = results.loaded
    for warning in loaded.warnings():
        print(warning, file=sys.stderr)
    summary = loaded.summary()
    print(summary[0] + f" under {source}")
    for line in summary[1:]:
        print(line)
    audited = audit.audit(results.per_response)
    for line in audit.unexplained_lines(audited):
        print(line, file=sys.stderr)
    print(audit.note(audited))
    for path in results.written:
        print(f"wrote {path}")
    line = skipped_line(results.skipped, results.removed)
    if line:
        print(line)
    print(f"done in {time.perf_counter() - start:.1f} s")
    if args.strict and audit.counts(audited)["unexplained"]:
        print("error: unexplained divergences from AR (--strict); see the lines above", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    run_cli(main)
