"""The presentation layer: what every interface shows, computed once (numbers with units, rankings,
GPU rows). The command line, the TUI and the report are views over it and over advisor.app; nothing
here prints or draws."""
