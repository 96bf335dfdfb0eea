"""Entry point of the `advisor` command: parse arguments, load the database once, dispatch.

Exit codes: 0 ok, 2 bad usage or bad input (one sentence on stderr), 1 internal error.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

from advisor import __version__
from advisor.cli import calibrate, estimate, gpus, memory, models, profile, report
from advisor.cli.arguments import note, set_quiet
from advisor.hardware.loader import load_hwdb
from advisor.process import exit_now, report_exit, terminate_on_sigterm



class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error as one sentence on stderr (exit 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--hwdb",
        action="append",
        default=[],
        metavar="DIR",
        help="extra hardware/price YAML directory; its entries replace shipped ones with the same id "
        "(repeatable; also $GPU_ADVISOR_HWDB and ~/.config/gpu-advisor/hwdb)",
    )
    common.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines or notes on stderr (errors still are)")
    parser = OneLineParser(
        prog="advisor",
        description="Predict training time, memory and cost of a PyTorch model on every GPU.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    estimate.add_parser(subparsers, [common])
    gpus.add_parser(subparsers, [common])
    models.add_parser(subparsers, [common])
    profile.add_parser(subparsers, [common])
    memory.add_parser(subparsers, [common])
    calibrate.add_parser(subparsers, [common])
    report.add_parser(subparsers, [common])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command; the exit code (0 ok, 2 bad input, 1 our bug, 130 Ctrl-C, 141 the
    reader of stdout went away, 143 SIGTERM). Every outcome but a bug is one line on stderr."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        set_quiet(args.quiet)
        db = load_hwdb(args.hwdb)
        for override in db.overrides:
            note(override.message())
        return args.run(args, db)
    except BaseException as exc:  # noqa: BLE001 -- every way out, each reported once
        return report_exit(exc, "advisor")


def console_main() -> NoReturn:
    """The `advisor` command (and `python -m advisor`): main(), then exit at once (advisor.process.exit_now):
    threads the model file started do not keep the process alive, and torch's million objects are
    left to the OS instead of being walked and finalised once more (0.6 s on a 2-core VM; on
    torch 2.15 that finalisation also prints nanobind's leak reports)."""
    terminate_on_sigterm()
    exit_now(main())


if __name__ == "__main__":
    console_main()
