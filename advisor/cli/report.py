"""`advisor report [MODEL.py] -o plan.html|plan.md`: the pre-purchase planning report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from advisor.app.plan import advise, advisor_runs
from advisor.cli.arguments import add_estimate_arguments, examples, progress, request_from_arguments
from advisor.cli.estimate import estimate_for, fits_nowhere
from advisor.errors import UserError
from advisor.hardware.specs import HardwareDB
from advisor.process import user_output_to_stderr


def add_parser(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        parents=parents,
        help="the planning report (HTML or Markdown with charts) for the purchase decision",
        **examples(("advisor report -o plan.html", "the ResNet-50 example's report, one HTML file"),
                   ("advisor report my_model.py -o plan.md --budget-usd 500", "Markdown, with a budget"),
                   ("advisor report llama --precision bf16 --deadline-hours 48 -o llama.html", "with a deadline")),
        description="Estimate MODEL on every device (as `advisor estimate`) and write the planning report: "
                    "recommendations, the model, charts of time against cost, memory and buy-versus-rent, the "
                    "device table, cloud offers with price dates and sources, assumptions and accuracy. "
                    "Without MODEL it reports on the built-in resnet50 example.",
    )
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="PATH",
                        help="plan.html (one self-contained file) or plan.md (charts in PATH-stem_charts/)")
    add_estimate_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, db: HardwareDB) -> int:
    from advisor.report.content import build_report  # matplotlib and jinja2: only when a report is written
    from advisor.report.render import report_format, write_report

    report_format(args.output)  # a bad file name is an error before seconds of tracing
    request = request_from_arguments(args)
    estimate = estimate_for(request, db)
    with user_output_to_stderr():
        plans = advise(request, db, estimate, progress)
    report = build_report(estimate, db, request.budget_usd, request.deadline_s, max_price_usd=request.max_price_usd,
                          plans=plans if advisor_runs(request, estimate) else None)
    written = write_report(report, args.output)
    print(f"advisor: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    print(args.output)
    if not estimate.fitting and not plans:  # the report says so too; scripts see it in the exit code
        raise UserError(fits_nowhere(estimate, request))
    return 0
