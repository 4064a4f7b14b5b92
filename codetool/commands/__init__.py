"""The commands of ``codetool`` that live in their own module (one thin, linear module each),
registered in ``codetool.cli.COMMANDS``."""
