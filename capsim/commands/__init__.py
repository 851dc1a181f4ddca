"""One module per command group; each has `add_parsers(sub)` registering its commands with `func` set."""
