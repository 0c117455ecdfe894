"""The `stator` command line: one module per subcommand, each with a config dataclass."""
