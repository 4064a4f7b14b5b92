"""One module per command (``codetool <command>``), each a config dataclass and a function listed
in ``codetool/cli.py``'s ``COMMANDS``. Commands sit above every other package."""
