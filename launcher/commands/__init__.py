"""One module per subcommand: ``add_parser(subparsers)`` sets ``func`` to its entry point."""
