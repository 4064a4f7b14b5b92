"""The executor's **host side**: what runs in the parent process, below the API (``Executor``,
``ExecutorConfig``, ``ExecutionResult``).

- the family and its processes: ``family`` (start, restart and stop a family's root),
  ``launch`` (the interpreter, bubblewrap's command line, the sources shipped into the sandbox),
  ``root_link`` and ``sandbox`` (the requests to the root and to the workers' keepers), ``pool``
  (families shared by many tasks), ``adoption`` (the host's side of the principals: fork copies'
  ``setresuid``, sweeps through the cgroup), ``scratch`` (the fallback family directory);
- one step: ``step`` (the protocol), ``verdict`` (what the result is decided from), ``proxy`` (the
  tool calls), ``channel`` (the frames and their checks).

**Trusts** nothing that comes from the sandbox: every frame, byte and exit status is checked
here, and the verdict is decided here. **May import** the standard library, ``codetool``'s base
modules (``config``, ``secrets``, ``tools.spec``), the executor's ``config`` and ``result``, and
``codetool.executor.kernel``; never the API above it (``codetool.executor``,
``codetool.executor.executor``) and never ``codetool.executor.inside``, whose files it ships as
text (``launch.SOURCES``) and does not import (``tests/test_layering.py``).
"""
