#!/usr/bin/env bash
# Step 1: the data. The benchmark files (StableToolBench test groups, CodeTool's subsets and TMDB
# spec, RestBench, ToolBench's examples) with `codetool data fetch`; the ToolBench release queries
# the trees are built on (G1_query.json) from ToolBench's data download, which `codetool data`
# cannot fetch; a clone of LimOkii/CodeTool for the judge. build-trees leaves out the
# StableToolBench test queries (by id and text) that ToolBench's G1_query.json contains.
#   bash scripts/paper/1_data.sh
source "$(dirname "$0")/env.sh"
from=()
[ -d "${SHARED:-}" ] && from=(--from "$SHARED")   # a local copy (SHARED); else downloaded
codetool data fetch stabletoolbench codetool restbench toolbench-examples "${from[@]}" --out "$DATA"
[ "$REHEARSAL" = 1 ] && "$PY" scripts/paper/stub_checkout.py "$CODETOOL_DIR"
if [ ! -f "$TOOLBENCH_QUERIES" ]; then
    echo "missing $TOOLBENCH_QUERIES: download ToolBench's data release (the data link in" \
         "https://github.com/OpenBMB/ToolBench's README), unzip it under $DATA/ToolBench/, or set TOOLBENCH_QUERIES." >&2
    exit 1
fi
if [ ! -f "$CODETOOL_DIR/eval/utils.py" ]; then
    echo "missing the CodeTool clone for the judge: git clone https://github.com/LimOkii/CodeTool $CODETOOL_DIR" \
         "(or set CODETOOL_DIR)." >&2
    exit 1
fi
echo "data ready in $DATA; trees from $TOOLBENCH_QUERIES; judge prompts from $CODETOOL_DIR"
