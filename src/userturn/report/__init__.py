"""Reading a run: the summary table, the HTML report and its plots, and run-to-run comparison."""

from .compute import build_report, export_tables, write_html_report

__all__ = ["build_report", "export_tables", "write_html_report"]
