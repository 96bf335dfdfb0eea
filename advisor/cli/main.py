"""Entry point of the `advisor` command: parse arguments, load the database once, dispatch.

Exit codes: 0 ok, 2 bad usage or bad input (one sentence on stderr), 1 internal error.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence

from advisor import __version__
from advisor.cli import calibrate, estimate, gpus, memory, profile, report
from advisor.errors import UserError
from advisor.hardware.loader import load_hwdb


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
    parser = argparse.ArgumentParser(
        prog="advisor",
        description="Predict training time, memory and cost of a PyTorch model on every GPU.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    estimate.add_parser(subparsers, [common])
    gpus.add_parser(subparsers, [common])
    profile.add_parser(subparsers, [common])
    memory.add_parser(subparsers, [common])
    calibrate.add_parser(subparsers, [common])
    report.add_parser(subparsers, [common])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        db = load_hwdb(args.hwdb)
        for override in db.overrides:
            print(f"advisor: note: {override.message()}", file=sys.stderr)
        return args.run(args, db)
    except UserError as exc:
        print(f"advisor: error: {exc}", file=sys.stderr)
        return exc.exit_code


def console_main() -> int:
    """The `advisor` command (and `python -m advisor`): main(), then the exit without the final
    garbage collection. torch and its compiler stack leave about a million objects that the
    interpreter would walk once more on exit (0.6 s on a 2-core VM, a tenth of a ResNet-50 estimate);
    frozen, they are left to the OS, which frees the memory anyway. Files and streams still close."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    raise SystemExit(console_main())
