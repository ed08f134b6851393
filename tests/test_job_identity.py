"""A job's identity, end to end: runs that differ in anything that can change a record write
their own files and are their own table rows, whose figures are those of their own records; AR,
which reads no W, is one job and one row whatever the sweep's widths."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from packedss.analysis.__main__ import main as analyse
from packedss.records import read_records
from tests.test_runner import readable_name, run_py
from tests.test_runner_compile import COMPILED_RUN


def _files(out: Path) -> list[Path]:
    return sorted(out.rglob("*.jsonl"))


def _own_figures(path: Path) -> dict:
    """Tokens/s and mean output tokens computed from one file's records alone."""
    records, bad = read_records(path)
    assert bad == []
    tokens = sum(r["output_tokens"] for r in records)
    return {"Tokens/s": tokens / sum(r["wall_s"] for r in records), "Tokens": tokens / len(records), "n": len(records)}


def _table6(results: Path) -> pd.DataFrame:
    assert analyse([str(results), "--tables", "6", "--n-resamples", "200"]) == 0
    return pd.read_csv(results / "tables" / "table6.csv", keep_default_na=False)


def _matches_own_records(table: pd.DataFrame, files: list[Path], method: str) -> None:
    rows = table[table["Method"] == method]
    assert len(rows) == len(files), rows
    expected = sorted((round(f["Tokens/s"], 6), round(f["Tokens"], 6)) for f in map(_own_figures, files))
    got = sorted((round(float(r["Tokens/s"]), 6), round(float(r["Tokens"]), 6)) for _, r in rows.iterrows())
    assert [x for pair in got for x in pair] == pytest.approx([x for pair in expected for x in pair], rel=1e-6)


def test_a_rerun_with_another_output_cap_is_its_own_file_and_row(model_overrides, tmp_path):
    records = tmp_path / "D" / "records"
    run_py([*model_overrides, "limit=3", f"out_dir={records}"], tmp_path)
    run_py([*model_overrides, "limit=5", "max_new_tokens=16", f"out_dir={records}"], tmp_path)
    files = _files(records)
    assert len(files) == 2 and {readable_name(f) for f in files} == {"packed-W8-T0-s0.jsonl"}
    assert sorted(_own_figures(f)["n"] for f in files) == [3, 5]
    table = _table6(tmp_path / "D")
    _matches_own_records(table, files, "Packed-SS")
    assert sorted(table["Config"]) == ["max_new_tokens=128", "max_new_tokens=16"]


def test_a_larger_limit_resumes_the_same_file(model_overrides, tmp_path):
    out = tmp_path / "out"
    run_py([*model_overrides, "limit=2", "max_new_tokens=16", f"out_dir={out}"], tmp_path)
    result = run_py([*model_overrides, "limit=3", "max_new_tokens=16", f"out_dir={out}"], tmp_path)
    (path,) = _files(out)
    assert "1 records written, 2 already recorded" in result.stdout
    assert len(read_records(path)[0]) == 3


def test_float16_beside_float32_are_two_rows_not_duplicates(model_overrides, tmp_path):
    records = tmp_path / "D" / "records"
    run_py(["-m", *model_overrides, "limit=2", "max_new_tokens=16", "dtype=float32,float16", f"out_dir={records}"], tmp_path)
    files = _files(records)
    assert len(files) == 2
    assert analyse([str(tmp_path / "D"), "--tables", "6", "--n-resamples", "200"]) == 0
    table = pd.read_csv(tmp_path / "D" / "tables" / "table6.csv", keep_default_na=False)
    _matches_own_records(table, files, "Packed-SS")
    assert sorted(table["Config"]) == ['dtype=float16', 'dtype=float32']


@pytest.mark.slow
def test_compiled_beside_eager_are_two_rows(model_overrides, tmp_path):
    records = tmp_path / "D" / "records"
    run_py(["-m", *model_overrides, *COMPILED_RUN, "model.compile=none,default", f"out_dir={records}"], tmp_path)
    files = _files(records)
    assert sorted(readable_name(f) for f in files) == ["packed-W4-T0-s0-compiled-default.jsonl", "packed-W4-T0-s0.jsonl"]
    table = _table6(tmp_path / "D")
    _matches_own_records(table, files, "Packed-SS")
    assert sorted(table["Config"]) == ['compile=default', 'compile=none']


def test_ar_is_decoded_once_and_shown_once_whatever_the_widths(model_overrides, tmp_path):
    records = tmp_path / "D" / "records"
    result = run_py(["-m", *model_overrides, "schedule=ar,linear,packed", "width=4,8", "limit=2", "max_new_tokens=16",
                     f"out_dir={records}"], tmp_path)  # fmt: skip
    names = sorted(readable_name(f) for f in _files(records))
    assert names == ["ar-T0-s0.jsonl", "linear-W4-T0-s0.jsonl", "linear-W8-T0-s0.jsonl", "packed-W4-T0-s0.jsonl",
                     "packed-W8-T0-s0.jsonl"], result.stdout  # fmt: skip
    by_schedule = {}
    for f in _files(records):
        for record in read_records(f)[0]:
            by_schedule.setdefault(record["schedule"], []).append(record)
    assert len(by_schedule["ar"]) == 2 and {(r["width"], r["block"]) for r in by_schedule["ar"]} == {(0, 1)}
    # pad_verify is identity only where the schedule reads it
    assert {r["pad_verify"] for s in ("ar", "linear") for r in by_schedule[s]} == {None}
    assert {r["pad_verify"] for r in by_schedule["packed"]} == {True}
    table = _table6(tmp_path / "D")
    assert list(table["Method"]).count("AR") == 1
    assert analyse([str(tmp_path / "D"), "--tables", "11", "--n-resamples", "200"]) == 0
    paired = pd.read_csv(tmp_path / "D" / "tables" / "table11.csv", keep_default_na=False)
    assert len(paired) > 0


def test_analysis_reads_the_folder_and_the_extra_records(tmp_path):
    from tests.analysis.synthetic import make_record, write_records

    write_records(tmp_path / "D", [make_record(schedule="packed", question=q) for q in range(2)])
    write_records(tmp_path / "OTHER", [make_record(schedule="linear", question=q) for q in range(2)])
    assert analyse([str(tmp_path / "D"), "--records", str(tmp_path / "OTHER"), "--tables", "6",
                    "--n-resamples", "200"]) == 0  # fmt: skip
    table = pd.read_csv(tmp_path / "D" / "tables" / "table6.csv", keep_default_na=False)
    assert sorted(table["Method"]) == ["Linear-SS", "Packed-SS"]


def test_the_same_identity_twice_keeps_the_first_copy_and_reports_it(tmp_path, capsys):
    from tests.analysis.synthetic import make_record, write_records

    records = [make_record(question=q) for q in range(2)]
    write_records(tmp_path / "D" / "a", records)
    write_records(tmp_path / "D" / "b", records)
    assert analyse([str(tmp_path / "D"), "--tables", "6", "--n-resamples", "200"]) == 0
    assert "2 duplicate records" in capsys.readouterr().out
    assert (tmp_path / "D" / "tables" / "table6.csv").read_text().count("Packed-SS") == 1


def test_absolute_tables_name_the_models_they_hold(tmp_path):
    from tests.analysis.synthetic import make_record, write_records

    write_records(tmp_path / "D", [make_record(schedule="packed", question=q) for q in range(2)])
    assert analyse([str(tmp_path / "D"), "--tables", "6", "--n-resamples", "200"]) == 0
    title = (tmp_path / "D" / "tables" / "table6.md").read_text().splitlines()[0]
    assert "Tiny (nemotron family): absolute measurements at temperature 0" in title, title


def _results(tmp_path, records):
    from packedss.analysis import load_results
    from tests.analysis.synthetic import write_records

    write_records(tmp_path / "R" / "records", records)
    return load_results(tmp_path / "R", n_resamples=200)


def test_comparisons_pair_only_runs_of_one_config(tmp_path):
    from tests.analysis.synthetic import make_record

    records = [make_record(schedule=s, question=q, dtype=d, call_s=c)
               for s, c in (("packed", 0.01), ("linear", 0.02)) for d in ("float32", "bfloat16") for q in range(4)]  # fmt: skip
    results = _results(tmp_path, records)
    pairings = results.comparisons.pairings("packed", "linear")
    assert sorted(p.config for p in pairings) == ["dtype=bfloat16", "dtype=float32"]
    for pairing in pairings:  # each pairs 4 questions of its own dtype
        assert set(results.comparisons.runs(pairing, "method")["dtype"]) == {pairing.config.split("=")[1]}
        assert len(results.comparisons.runs(pairing, "base")) == 4
    from packedss.analysis.tables import TABLES

    table3 = TABLES[3].function(results.per_question, results.comparisons, False).data
    assert len(table3) == 4 and sorted(set(table3["Config"])) == ["dtype=bfloat16", "dtype=float32"]


def test_a_schedule_that_reads_no_width_is_compared_at_every_width(tmp_path):
    from tests.analysis.synthetic import make_record

    records = [make_record(schedule="packed", width=w, question=q) for w in (4, 8) for q in range(3)]
    records += [make_record(schedule="ar", width=8, question=q) for q in range(3)]  # recorded at W = 0
    results = _results(tmp_path, records)
    pairings = results.comparisons.pairings("packed", "ar")
    assert sorted((p.width, p.method_width, p.base_width) for p in pairings) == [(4, 4, 0), (8, 8, 0)]
    assert all(len(results.comparisons.runs(p, "base")) == 3 for p in pairings)


def test_a_sweep_over_limits_is_two_jobs_and_ar_over_widths_one():
    from packedss.plan import plan

    jobs = plan([["model=tiny", "schedule=ar,packed", "width=4,8", "limit=1,2"]])
    assert sorted((j.schedule, j.width, j.n) for j in jobs) == [
        ("ar", 0, 1), ("ar", 0, 2), ("packed", 4, 1), ("packed", 4, 2), ("packed", 8, 1), ("packed", 8, 2)]  # fmt: skip


def test_a_models_own_width_is_its_default_and_one_job_with_the_same_width_given():
    """A model config's released width (SDAR: 3) is the width of a job that names none; width=N
    wins; the same W, from the model or given, is one job (the source is not identity)."""
    from packedss.plan import format_plan, plan

    jobs = plan([["model=tiny-sdar", "schedule=sdar-native,packed"], ["model=tiny-sdar", "schedule=packed", "width=3"],
                 ["model=tiny-sdar", "schedule=packed", "width=7"], ["model=tiny", "schedule=packed"]])  # fmt: skip
    assert [(j.model, j.schedule, j.width, j.block, j.width_source) for j in jobs] == [
        ("tiny-sdar", "sdar-native", 3, 4, "model"), ("tiny-sdar", "packed", 3, 4, "model"),
        ("tiny-sdar", "packed", 7, 8, "explicit"), ("tiny", "packed", 8, 9, "default")]  # fmt: skip
    rows = format_plan(jobs).splitlines()  # the plan's W column says where a W not given came from
    for row, cells in zip(rows[1:5], ("sdar-native +3 \\(model\\) +4", "packed +3 \\(model\\) +4", "packed +7 +8",
                                      "packed +8 \\(default\\) +9")):  # fmt: skip
        assert re.search(f" {cells} ", row), row


def test_every_model_config_that_names_a_width_is_in_the_docs_table_of_defaults():
    """docs/configuration.md's table of each family's and model's default width agrees with conf/model/."""
    from omegaconf import OmegaConf

    from packedss.paths import CONF_DIR, PROJECT_ROOT

    docs = (PROJECT_ROOT / "docs" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `([\w.-]+)` \| \w+ \| (\d+|\d+ \(global\)) \|", docs, flags=re.M))
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        width = OmegaConf.load(path).get("width")
        assert path.stem in rows, f"docs/configuration.md lists no default width for model {path.stem}"
        assert rows[path.stem] == (str(width) if width is not None else "8 (global)"), path.stem


@pytest.mark.parametrize("overrides, race_hash, inverse_cdf_hash, sampler", [
    (["model=tiny", "schedule=packed"], "724fdd96e9375e6d", "724fdd96e9375e6d", None),
    (["model=tiny-sdar", "schedule=sdar-native", "temperature=1"], "80c7fbf79a69cded", "80c7fbf79a69cded", None),
    (["model=tiny", "schedule=packed", "temperature=1"], "041bb72012b5180f", "f4747f0ff01c6a37", "blocked-inverse-cdf"),
    (["model=tiny-set", "schedule=ar", "temperature=1"], "3db2004464bdd6af", "54a5c98683b28afa", "blocked-inverse-cdf"),
])  # fmt: skip
def test_each_sampler_is_identity_only_for_the_jobs_it_changed(overrides, race_hash, inverse_cdf_hash, sampler):
    """The hashes are those the jobs had while T > 0 sampling was the exponential race, then the
    inverse CDF over the whole vocabulary: a job neither changed (T = 0; SDAR's native decoder,
    which keeps the race) keeps its identity and its record file; a T > 0 job each changed gets a
    new one, so a resume never appends new-sampler responses to a file of old ones."""
    from packedss.benchmark.loading import compose_run_config
    from packedss.job import configured_spec

    spec = configured_spec(compose_run_config(overrides))
    assert spec.sampler == sampler
    assert ("sampler" in spec.fields()) == (sampler is not None)
    assert (spec.config_hash == race_hash) == (sampler is None)
    assert (spec.config_hash == inverse_cdf_hash) == (sampler is None)


def test_spec_benchs_per_category_selects_questions_and_is_not_identity():
    """Like `limit`: a rerun with more questions of each category resumes the same file."""
    from packedss.benchmark.loading import compose_run_config
    from packedss.job import configured_spec

    one, two = (configured_spec(compose_run_config(["model=tiny", "task=specbench", "schedule=pld", f"task.per_category={n}"]))
                for n in (1, 2))  # fmt: skip
    assert one.config_hash == two.config_hash and "per_category" not in one.task_config


@pytest.mark.parametrize("overrides, old_hash", [
    (["model=tiny", "schedule=packed"], "724fdd96e9375e6d"),
    (["model=tiny", "schedule=ar"], "a76fb5b20d5286ea"),
    (["model=tiny-set", "schedule=linear"], "651eb24b2df39222"),
    (["model=tiny-set", "schedule=native"], "3d6b40e36a25c9a3"),
    (["model=tiny-sdar", "schedule=s2d2", "temperature=1"], "27032a18d0d6ca5a"),
])  # fmt: skip
def test_max_ngram_is_no_part_of_the_identity_of_a_schedule_that_reads_none(overrides, old_hash):
    """The hashes are those the jobs had before `schedule.max_ngram` existed: a job of a schedule
    other than pld keeps its identity and its record file, whatever max_ngram says."""
    from packedss.benchmark.loading import compose_run_config
    from packedss.job import configured_spec

    for extra in ([], ["schedule.max_ngram=3"]):
        spec = configured_spec(compose_run_config([*overrides, *extra]))
        assert spec.max_ngram is None and "max_ngram" not in spec.fields()
        assert spec.config_hash == old_hash


def test_pld_records_name_their_max_ngram():
    from packedss.benchmark.loading import compose_run_config
    from packedss.job import configured_spec

    specs = {n: configured_spec(compose_run_config(["model=tiny", "schedule=pld", *extra]))
             for n, extra in ((2, []), (None, ["schedule.max_ngram=null"]), (1, ["schedule.max_ngram=1"]),
                              (3, ["schedule.max_ngram=3"]))}  # fmt: skip
    assert specs[2].fields()["max_ngram"] == 2 and specs[None] == specs[2]  # null: transformers' default
    assert len({specs[n].config_hash for n in (1, 2, 3)}) == 3
    assert specs[2].record_path("o").name == f"pld-W8-T0-s0-{specs[2].config_hash}.jsonl"
    assert specs[3].record_path("o").name == f"pld-n3-W8-T0-s0-{specs[3].config_hash}.jsonl"


def test_the_job_hands_pld_its_max_ngram(tmp_path):
    from packedss.benchmark.loading import compose_run_config
    from packedss.job import job_spec

    common = ["model=tiny-set", "schedule.max_ngram=1", "device=cpu", f"out_dir={tmp_path}"]
    job = job_spec(compose_run_config(["schedule=pld", *common]))
    assert job.settings_fields == {"order": "ltr", "max_ngram": 1} and job.identity.max_ngram == 1
    assert job_spec(compose_run_config(["schedule=linear", *common])).settings_fields == {"order": "ltr"}
