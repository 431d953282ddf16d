"""Reading a run: the summary table, the HTML report and its plots, and run-to-run comparison.

``build_report`` computes every number once from a run's turns; ``write_html_report`` lays it
out as one self-contained page, ``export_tables`` writes its tables, and
``figures.write_figures`` draws its plots for papers.
"""

from userturn.report.compute import Report, build_report
from userturn.report.page import write_html_report
from userturn.report.tables import export_tables

__all__ = ["Report", "build_report", "export_tables", "write_html_report"]
