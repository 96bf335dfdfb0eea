"""The application surface: one request (`PlanRequest`) and one call (`plan`) that the command line,
the TUI, the report and Python users share. Every option of an estimate exists here once."""
