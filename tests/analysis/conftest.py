from __future__ import annotations

import pytest

from tests.analysis.synthetic import synthetic_results

N_RESAMPLES = 999  # fewer resamples than the default 10,000 keep the tests fast


@pytest.fixture(autouse=True)
def close_figures():
    """The figures a test drew and did not write (write_figure closes its own): pyplot keeps each
    open until closed, and warns past 20."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory):
    """A small synthetic results folder covering every table and figure (written once)."""
    return synthetic_results(tmp_path_factory.mktemp("results"))
