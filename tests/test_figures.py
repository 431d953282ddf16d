"""userturn report RUN --figures DIR: every plot of the report as PDF and PNG, from its numbers."""

from __future__ import annotations

import pytest
from helpers import build_report_run

from userturn import load_run
from userturn.cli.main import main

pytest.importorskip("matplotlib", reason="pip install 'userturn[figures]'")

PLOTS = ("follow_up_vs_temperature", "accuracy_vs_follow_up", "labels", "perturbations")


def test_figures_are_written_as_pdf_and_png(tmp_path, capsys):
    store = build_report_run(tmp_path, ["fake/alpha", "fake/beta"])
    store.close()
    figures = tmp_path / "figures"
    assert main(["report", str(tmp_path / "run"), "--figures", str(figures)]) == 0
    assert "wrote 8 figure files" in capsys.readouterr().out
    for name in PLOTS:
        assert (figures / f"{name}.pdf").read_bytes().startswith(b"%PDF")
        png = (figures / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG")
        width = int.from_bytes(png[16:20], "big")  # the IHDR chunk: 300 dpi of a paper width
        assert 600 < width < 2400
    assert not (tmp_path / "run" / "report.html").exists()  # figures alone: no page


def test_a_plot_without_data_is_left_out(tmp_path):
    from userturn.report.figures import write_figures

    store = build_report_run(tmp_path, ["fake/alpha"], temperatures=[0.0], perturbations=[])
    store.close()
    written = {path.name for path in write_figures(load_run(tmp_path / "run").report(),
                                                   tmp_path / "figures")}
    assert "perturbations.pdf" not in written  # no perturbation: no forest plot, as on the page
    assert {"labels.pdf", "labels.png", "follow_up_vs_temperature.png"} <= written
