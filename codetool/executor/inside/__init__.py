"""The executor's **sandbox side**: the code that runs inside the sandbox, in the family's root
(``root``, ``spawn``, ``principals``, ``scratch``) and in each worker (``keeper``, the trusted
main thread that decides nothing but writes the verdict bytes; ``worker``, the state the step's
code can reach; ``io``, its channel and output; ``copy``, a fork copy's reopening of files).

These files are **shipped as source**: the host reads them as text and sends them to the sandbox
interpreter (``codetool.executor.host.launch.SOURCES``), which installs each under its wire name
(``sandbox_root``, ``sandbox_keeper``...) and never sees the package. So each module **may
import** only the standard library, the other modules of this folder and the shipped modules of
``codetool.executor.kernel`` (``calls``, ``procs``), by their wire names, with the package path as
a fallback for when the host imports one (tests, documentation tools)
(``tests/test_executor_boundary.py``). No module outside this folder imports it.

**Trusts** no object of the host's: nothing of ``host/`` or the API is shipped, and what crosses
is JSON frames, the shipped sources and descriptors. The root carries out the host's requests
(it is the host's agent in the sandbox, and polices the principals for it); a worker's keeper
trusts nothing of the state it keeps; ``worker`` is reachable by the step's code and so is
trusted by nobody.
"""
