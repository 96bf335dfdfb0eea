"""The `advisor` command line: one module per subcommand, `main` dispatches."""
