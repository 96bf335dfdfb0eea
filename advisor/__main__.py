"""`python -m advisor` runs the command line."""

from advisor.cli.main import console_main

console_main()
