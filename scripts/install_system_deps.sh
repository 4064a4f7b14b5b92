#!/usr/bin/env bash
# Install the system packages codetool uses, when this user can:
#   bubblewrap  the executor's OS sandbox (namespaces, read-only root, scratch tmpfs)
#   python3     a system interpreter that an unprivileged uid can run: the sandbox drops to a
#               fresh uid, and a virtualenv under root's home is not readable by it
# Without them the executor runs in its fallback mode (rlimits, scrubbed environment, scratch
# directory) and the tests that need them are skipped; nothing else changes.
#   bash scripts/install_system_deps.sh
set -u
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
[ -x /usr/bin/python3 ] || missing+=(python3)
[ ${#missing[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "installing ${missing[*]} (executor sandbox) with apt-get ..."
    export DEBIAN_FRONTEND=noninteractive
    if ! (apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || \
          (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1)); then
        echo "note: could not install ${missing[*]}; the executor will use its fallback sandbox." >&2
    fi
else
    echo "note: ${missing[*]} not installed and apt-get is unavailable or needs root; install them" \
         "(e.g. 'sudo apt-get install ${missing[*]}') for the full executor sandbox." >&2
fi
exit 0
