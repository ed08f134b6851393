"""python -m packedss.analysis RESULTS_DIR [--compare-paper] [--tables 6,10] [--figures 3,4,5]

Reads every JSONL record under RESULTS_DIR/records (or RESULTS_DIR), reports bad lines with file
and line number, and writes tables under RESULTS_DIR/tables and figures under
RESULTS_DIR/figures. Without --tables/--figures it writes all of them; with only one of the two
options, only what that option names. With any table it also writes runs.csv/.md/.tex, one row
per run of every model family in the records."""

from __future__ import annotations

import argparse
import sys
import time

from packedss.analysis import N_RESAMPLES, analyse, audit, record_sources
from packedss.analysis.figures import FIGURES
from packedss.analysis.tables import TABLES


def _numbers(text: str, valid, what: str) -> list[int]:
    if text.strip().lower() in ("", "none"):
        return []
    if text.strip().lower() == "all":
        return list(valid)
    try:
        numbers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated numbers, e.g. 6,10") from None
    bad = [n for n in numbers if n not in valid]
    if bad:
        raise argparse.ArgumentTypeError(f"no {what} {bad}; valid: {', '.join(map(str, valid))}")
    return numbers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packedss.analysis", description=__doc__.split("\n\n")[1])
    parser.add_argument("results_dir", help="results folder (records under RESULTS_DIR/records or RESULTS_DIR)")
    parser.add_argument("--tables", type=lambda t: _numbers(t, TABLES, "table"), default=None, help="e.g. 6,10 (default: all, 2-13)")
    parser.add_argument("--figures", type=lambda t: _numbers(t, FIGURES, "figure"), default=None, help="e.g. 3,5 (default: all, 3-5)")
    parser.add_argument("--compare-paper", action="store_true", help="show the paper's published numbers beside the measured ones")
    parser.add_argument("--n-resamples", type=int, default=N_RESAMPLES, help=f"bootstrap resamples (default {N_RESAMPLES})")
    parser.add_argument("--out", default=None, help="write tables/ and figures/ here instead of RESULTS_DIR")
    parser.add_argument("--records", nargs="+", default=[], metavar="PATH", help="further record files or folders to read (e.g. other tables' runs)")
    parser.add_argument("--strict", action="store_true", help="exit 3 when the divergence audit finds an unexplained divergence")
    args = parser.parse_args(argv)

    tables, figures = args.tables, args.figures
    if tables is not None and figures is None:
        figures = []
    if figures is not None and tables is None:
        tables = []
    sources = record_sources(args.results_dir, args.records)
    missing = [str(p) for p in sources if not p.exists()]
    if not sources or missing:
        print(f"error: no records folder {', '.join(missing) or args.results_dir}", file=sys.stderr)
        return 2
    source = ", ".join(map(str, sources))
    start = time.perf_counter()
    results = analyse(args.results_dir, tables, figures, args.compare_paper, args.n_resamples, args.out, args.records)
    loaded = results.loaded
    for bad in loaded.bad_lines:
        print(f"warning: bad record line skipped: {bad}", file=sys.stderr)
    print(loaded.report().splitlines()[0] + f" under {source}")
    for line in loaded.report().splitlines()[1:]:
        if not line.startswith("bad line"):
            print(line)
    if loaded.frame.empty:
        print(f"error: no usable records under {source}", file=sys.stderr)
        return 1
    audited = audit.audit(results.per_response)
    for line in audit.unexplained_lines(audited):
        print(line, file=sys.stderr)
    print(audit.note(audited))
    for path in results.written:
        print(f"wrote {path}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    if args.strict and audit.counts(audited)["unexplained"]:
        print("error: unexplained divergences from AR (--strict); see the lines above", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
