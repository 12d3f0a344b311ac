"""Built-in environments (gymnasium adapter, multi-agent games) and example experiments."""
