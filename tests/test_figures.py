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


def _two_models_one_never_right(tmp_path):
    """fake/zero answers every question wrong (0% accuracy), fake/some the first three right."""
    import json

    from helpers import QUESTIONS, experiment, is_user_turn

    from userturn.backends.fake import ScriptedBackend
    from userturn.probe.pipeline import run_experiment

    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": f"#### {a}"}) + "\n"
                            for q, a in QUESTIONS), encoding="utf-8")

    def script(right: int):
        def answer(request) -> str:
            if is_user_turn(request):
                return "Why that number?" if request.seed % 2 else "Thanks!"
            index = next(i for i, (q, _) in enumerate(QUESTIONS) if q in request.prompt)
            return f"#### {QUESTIONS[index][1] if index < right else 0}"
        return answer

    models = ["fake/zero", "fake/some"]
    exp = experiment(data, tmp_path, models=models)
    backends = {m: ScriptedBackend(script(0 if m == "fake/zero" else 3), spec=m) for m in models}
    run_experiment(exp, backends=backends).close()
    return exp.plan.output


def test_an_interval_at_zero_accuracy_is_drawn_beside_the_axis_not_under_it(tmp_path):
    import numpy as np
    from matplotlib.image import imread

    from userturn.report.figures import write_figures
    from userturn.report.plots import model_colour

    run = _two_models_one_never_right(tmp_path)
    report = load_run(run).report()
    accuracy = {model: acc.value for model, acc, _ in report.panels[0].points}
    assert accuracy == {"fake/zero": 0.0, "fake/some": 0.5}
    write_figures(report, tmp_path / "figures")
    image = imread(tmp_path / "figures" / "accuracy_vs_follow_up.png")[..., :3]
    left = image[:, : image.shape[1] // 3]  # the first panel's y axis and the dots at 0%
    dark = (left.max(axis=2) < 0.25).sum(axis=0)
    axis_column = int(np.argmax(dark))  # the y axis: the darkest column
    blue = np.array([int(model_colour(0)[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    is_blue = (np.abs(left - blue).max(axis=2) < 0.08).sum(axis=0)
    bar_column = int(np.argmax(is_blue))  # fake/zero's vertical interval at x = 0
    assert is_blue[bar_column] > 20 and bar_column > axis_column + 3, (axis_column, bar_column)


def test_one_model_gives_no_accuracy_panel_but_its_numbers(tmp_path):
    from userturn.report import write_html_report
    from userturn.report.figures import write_figures

    store = build_report_run(tmp_path, ["fake/alpha"], perturbations=[])
    store.close()
    report = load_run(tmp_path / "run").report()
    written = {path.name for path in write_figures(report, tmp_path / "figures")}
    assert "accuracy_vs_follow_up.png" not in written
    html = write_html_report(report, tmp_path / "report.html").read_text(encoding="utf-8")
    section = html.split('<section id="accuracy">')[1].split("</section>")[0]
    assert '<svg class="plot scatter"' not in section and "too few for Spearman" not in section
    assert "1 model with scored answers" in section
    assert section.count("<tr>") == 1 + len(report.panels)  # the header, a row per T
    assert "50%" in section  # alpha's accuracy: 3 of 6
