"""The `gpu-advisor` Textual TUI: a thin app file, one screen per module, styles in .tcss."""
