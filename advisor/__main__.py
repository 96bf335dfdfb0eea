"""`python -m advisor` runs the command line."""

from advisor.cli.main import console_main

raise SystemExit(console_main())
