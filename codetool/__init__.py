"""codetool: process reward models for LLM agents that call tools by writing code.

The method is CodeTool (Lu et al., ACL 2025): at each step a policy LLM writes a Python snippet
that calls REST tools, several candidate snippets are sampled and executed, and the step is
chosen by the on-the-spot reward (did the code run?) plus the latent reward (a process reward
model's estimate of how promising the step is). See ``README.md`` for the pipeline; the Python
API is :mod:`codetool.api` (``from codetool.api import PRM, search, read_trajectories``; docs/API.md).
"""

__version__ = "0.2.0"


class CodetoolError(Exception):
    """An error meant for a user: the message says what was received and how to fix it.

    The CLI prints only the message of these (a traceback needs ``--debug``); any other
    exception is a bug and is shown in full.
    """
