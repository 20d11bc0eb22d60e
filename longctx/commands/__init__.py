"""The ``longctx`` subcommands, one module each with ``add_parser(subparsers)`` and ``run(args) -> int``.

Each keeps its heavy imports (datatrove, torch) inside ``run`` so that ``longctx --help`` is instant,
and hands each job only its own config section.
"""
