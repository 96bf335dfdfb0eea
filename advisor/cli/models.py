"""`advisor models`: the built-in catalog of Hugging Face configs that `hf:NAME` finds offline."""

from __future__ import annotations

import argparse
import json

from advisor.cli.arguments import examples
from advisor.cli.table import Column, output_width, render_table
from advisor.hardware.specs import HardwareDB
from advisor.profile.hub import catalog


def add_parser(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "models",
        parents=parents,
        help="list the models `hf:NAME` builds offline (the built-in catalog of configs)",
        **examples(("advisor models", "every model of the catalog with its aliases"),
                   ("advisor estimate hf:llama-3.1-8b --lora 16 --gpu a10g", "one of them, by an alias"),
                   ("advisor models --json", "as JSON, with each config's source")),
        description="Configs of popular models shipped with gpu-advisor, so `hf:ORG/NAME` (or an alias) works "
                    "without the Hub. Other names come from the local Hugging Face cache or the Hub.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, db: HardwareDB) -> int:
    models = catalog()
    if args.json:
        print(json.dumps({"models": [{"id": model_id, **entry} for model_id, entry in models.items()]}, indent=2))
        return 0
    rows = [[f"hf:{model_id}", f"{entry.get('params_b', 0):,.2f}", ", ".join(entry.get("aliases") or ())]
            for model_id, entry in sorted(models.items(), key=lambda item: item[0].lower())]
    columns = [Column("Model"), Column("Params B", align_right=True), Column("Aliases", drop_order=1)]
    print(render_table(columns, rows, output_width()))
    return 0
