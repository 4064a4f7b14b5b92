#!/usr/bin/env bash
# Free disk where CI writes, printed by .ci/run before it starts and between its stages (a CI
# machine whose disk filled failed 43 s in, inside pip, with "[Errno 28] No space left on device"):
#   repo      the repository's filesystem: .venv, .venv-vllm, checkpoints/, reports/
#   tmp       $TMPDIR (or /tmp): pip's downloads and builds, pytest's tmp_path
#   pip cache `pip cache dir` (or "disabled" under PIP_NO_CACHE_DIR, as .ci/run sets it)
# With --need GB it warns (exit status still 0) when the repository's filesystem has less than GB
# free: a full CI from a clean clone needs about 8 GB (docs/DEMO.md, "Disk").
#   bash scripts/ci_disk.sh [--need GB] [LABEL]
set -u
need_gb=""
if [ "${1:-}" = "--need" ]; then need_gb=$2; shift 2; fi
label=${1:-now}
tmp=${TMPDIR:-/tmp}
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python

# df -Ph: one line per filesystem, even for long device names; the 4th column is what is free.
avail() { df -Ph "$1" 2>/dev/null | awk 'NR == 2 {print $4 " free of " $2 " on " $6}' | grep . || echo "missing"; }

echo "ci_disk: ${label}"
echo "ci_disk:   repo $(pwd): $(avail .)"
echo "ci_disk:   tmp ${tmp}: $(avail "$tmp")"
if [ -n "${PIP_NO_CACHE_DIR:-}" ]; then
    echo "ci_disk:   pip cache: disabled (PIP_NO_CACHE_DIR)"
elif cache=$("$py" -m pip cache dir 2>/dev/null); then
    used=$(du -sh "$cache" 2>/dev/null | cut -f1)
    parent=$cache
    while [ ! -e "$parent" ]; do parent=$(dirname "$parent"); done
    echo "ci_disk:   pip cache ${cache}: ${used:-0} used; $(avail "$parent")"
else
    echo "ci_disk:   pip cache: unknown (no pip for ${py})"
fi
if [ -n "$need_gb" ]; then
    free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
    if [ "$free_kb" -lt $(( need_gb * 1024 * 1024 )) ]; then
        echo "ci_disk: warning: $(( free_kb / 1024 / 1024 )) GB free on the repository's filesystem;" \
             "a full CI from a clean clone needs about ${need_gb} GB (docs/DEMO.md, \"Disk\"): free some" \
             "(an old .venv-vllm, pip's cache) or use a larger disk" >&2
    fi
fi
exit 0
