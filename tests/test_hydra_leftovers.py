"""The suite's check that it left no Hydra run directories in the repository (tests/conftest.py,
tests/hydra_leftovers.py) blames only the directories its own tests' runs made."""

from __future__ import annotations

import sys
import time

from packedss.paths import PROJECT_ROOT
from tests.bad_inputs import run
from tests.hydra_leftovers import hydra_run_dirs, leftovers, report_lines


def saved_run(run_dir, *overrides: str) -> None:
    """A run directory as Hydra leaves one: the job's overrides and composed config."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    values = dict(o.split("=", 1) for o in overrides)
    (run_dir / ".hydra" / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in values.items()))


def test_runs_of_the_users_own_and_from_before_the_session_are_not_blamed(tmp_path):
    temp_root, root = tmp_path / "pytest-7", tmp_path / "repository"
    saved_run(root / "outputs" / "2026-12-01" / "09-00-00", f"out_dir={temp_root}/old/records")  # before the session
    before = hydra_run_dirs(root)
    # meanwhile, the user's README commands from the root: a run and a sweep, and one without .hydra
    saved_run(root / "outputs" / "2026-12-04" / "01-00-00", "limit=5", "out_dir=results/demo")
    saved_run(root / "multirun" / "2026-12-04" / "01-00-00" / "0", "schedule=ar", "data_dir=../shared/data")
    (root / "multirun" / "2026-12-04" / "01-00-00" / "multirun.yaml").write_text(
        f"hydra:\n  runtime:\n    cwd: {temp_root}\n  overrides:\n    task:\n    - schedule=ar,linear\n")
    (root / "outputs" / "2026-12-04" / "01-00-05").mkdir(parents=True)
    saved_run(root / "outputs" / "2026-12-04" / "01-00-06", f"out_dir={temp_root}0/x")  # another session, pytest-70
    # the suite's own: a run and a sweep given folders under its temporary root
    saved_run(root / "outputs" / "2026-12-04" / "01-00-01", f"out_dir={temp_root}/test_run0/records", "limit=1")
    sweep = root / "multirun" / "2026-12-04" / "01-00-02"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(f"hydra:\n  overrides:\n    task:\n    - model.path='{temp_root}/ckpt'\n")
    left = leftovers(root, before, temp_root)
    assert left.suite == ["multirun/2026-12-04/01-00-02", "outputs/2026-12-04/01-00-01"]
    assert left.others == ["multirun/2026-12-04/01-00-00", "outputs/2026-12-04/01-00-00", "outputs/2026-12-04/01-00-05",
                           "outputs/2026-12-04/01-00-06"]  # fmt: skip
    error, note = report_lines(left)
    assert error.startswith("error: the suite left Hydra run directories in the repository (multirun/2026-12-04/01-00-02, outputs/")
    assert note.startswith("note: multirun/2026-12-04/01-00-00, outputs/2026-12-04/01-00-00") and "left in place" in note
    assert report_lines(leftovers(root, hydra_run_dirs(root), temp_root)) == (None, None)


def test_a_test_run_and_a_users_run_are_told_apart_as_run_py_saves_them(tmp_path, tmp_path_factory):
    """Two real runs from a checkout's root without a hydra.run.dir: a test's, given its tmp_path,
    and a user's README command; Hydra names the root (under the temporary root here) in its own
    settings, which are not read."""
    root = tmp_path / "checkout"
    root.mkdir()
    for out_dir in (f"{tmp_path}/records", "results/demo/records"):
        result = run([sys.executable, str(PROJECT_ROOT / "run.py"), "limit=1", "max_new_tokens=4", f"out_dir={out_dir}"], tmp_path, cwd=root)
        assert result.returncode == 0, result.stderr[-2000:]
        time.sleep(1.1)  # Hydra's run directories are named to the second
    left = leftovers(root, set(), tmp_path_factory.getbasetemp())
    [test_run] = left.suite
    [users_run] = left.others
    assert test_run.startswith("outputs/") and (root / test_run / ".hydra" / "hydra.yaml").is_file()
    assert "results/demo/records" in (root / users_run / ".hydra" / "overrides.yaml").read_text()


def test_every_tests_temporary_folder_is_under_the_sessions_root(tmp_path, tmp_path_factory, worker_id):
    """The check reads the controller's temporary root; pytest-xdist gives each worker its own under it."""
    base = tmp_path_factory.getbasetemp()
    assert base in tmp_path.parents
    if worker_id != "master":  # a worker's root is the controller's popen-<worker>
        assert base.name == f"popen-{worker_id}"
