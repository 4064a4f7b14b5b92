#!/usr/bin/env bash
# Install the system packages codetool uses, when this user can: bubblewrap (the executor's OS
# sandbox). Without it the executor runs in its fallback mode (rlimits, scrubbed environment,
# scratch directory) and the namespace tests are skipped; nothing else changes.
#   bash scripts/install_system_deps.sh
set -u
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "installing bubblewrap (executor sandbox) with apt-get ..."
    if ! (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
          (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1)); then
        echo "note: could not install bubblewrap; the executor will use its fallback sandbox." >&2
    fi
else
    echo "note: bubblewrap is not installed and apt-get is unavailable or needs root;" \
         "install it (e.g. 'sudo apt-get install bubblewrap') for the namespace sandbox." >&2
fi
exit 0
