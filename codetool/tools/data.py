"""The public benchmark files: get them (:func:`fetch`, which ``codetool data fetch`` runs), and find
them again (:func:`data_root`).

The files come from four public repositories (StableToolBench, ToolBench, RestGPT, CodeTool) and
keep their upstream layout under ``<out>/<Repository>/...`` (e.g. ``data/RestGPT/specs/tmdb_oas.json``).
``codetool data fetch restbench --from-dir DIR`` copies them from a local folder laid out the same
way (such as ``../shared/data``); without ``--from-dir`` they are downloaded from
``raw.githubusercontent.com`` (default branch). Each run prints what it got and what is missing,
and records the datasets it completed in ``<out>/.codetool-data.json`` so :func:`data_root` finds
them.

Not fetched: StableToolBench's tool documentation (``toolenv/tools``) and response cache, which are
separate multi-gigabyte downloads upstream; the loaders build API specs from each query's
``api_list`` instead. The CodeTool TMDB spec embeds an access token upstream: it is replaced by a
placeholder before the file is written.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from urllib.parse import quote

from codetool import CodetoolError

logger = logging.getLogger(__name__)

MARKER = ".codetool-data.json"
_GROUPS = ("G1_instruction", "G1_category", "G1_tool", "G2_instruction", "G2_category", "G3_instruction")
_REPOS = {"StableToolBench": "THUNLP-MT/StableToolBench", "ToolBench": "OpenBMB/ToolBench",
          "RestGPT": "Yifan-Song793/RestGPT", "CodeTool": "LimOkii/CodeTool"}


def _stabletoolbench_files() -> list[str]:
    files = ["StableToolBench/LICENSE"]
    for group in _GROUPS:
        files += [f"StableToolBench/solvable_queries/test_instruction/{group}.json",
                  f"StableToolBench/solvable_queries/test_query_ids/{group}.json",
                  f"StableToolBench/toolbench/tooleval/results/default_evalset/gpt-3.5-turbo_CoT/{group}.json"]
    results = "StableToolBench/toolbench/tooleval/results"
    files += [f"{results}/default_evalset/DFS/win.csv"]
    files += [f"{results}/leaderboard###default_evalset###tooleval_gpt-3.5-turbo_normalized###{m}.csv"
              for m in ("ChatGPT-DFSDT", "gpt-3.5-turbo_CoT")]
    files += ["StableToolBench/solvable_queries_example/test_instruction/G1_instruction.json",
              "StableToolBench/solvable_queries_example/test_query_ids/G1_instruction.json"]
    example = "StableToolBench/data_example"
    for qid in (1073, 588, 608):
        files += [f"{example}/answer/virtual_chatgpt_cot/G1_instruction/{qid}_CoT@1.json",
                  f"{example}/answer/virtual_chatgpt_dfs/G1_instruction/{qid}_DFS_woFilter_w2.json"]
    for method in ("cot", "dfs"):
        files += [f"{example}/model_predictions_converted/virtual_chatgpt_{method}/G1_instruction.json"]
        files += [f"{example}/pass_rate_results/virtual_chatgpt_{method}/G1_instruction_virtual_chatgpt_{method}.{ext}"
                  for ext in ("csv", "json")]
    files += [f"{example}/preference_results/G1_instruction_virtual_chatgpt_cot_virtual_chatgpt_dfs.{ext}"
              for ext in ("csv", "json")]
    return files


def _toolbench_example_files() -> list[str]:
    base = "ToolBench/data_example"
    files = ["ToolBench/LICENSE"]
    files += [f"{base}/instruction/{name}.json" for name in
              ("G1_query", "G2_query", "G3_query", "inference_query_demo", "inference_query_demo_open_domain")]
    answers = {"G1": (10, 11, 57, 59, 69), "G2": (102, 10, 119, 127, 52), "G3": (13, 15, 21, 3, 8)}
    files += [f"{base}/answer/{g}_answer/{i}_ChatGPT_DFS_woFilter_w2.json" for g, ids in answers.items() for i in ids]
    examples = {"Advertising": ("privatepublicapi", "publicapitestinginbox", "putreq"),
                "Artificial_Intelligence_Machine_Learning": (
                    "speech_recognition", "stable_diffusion_v2", "starpredictai_ai_powered_text_review_star_predictor"),
                "Business": ("abuse_ip_check", "acopaer", "acrosuite_oauther"),
                "Commerce": ("ado_stock", "aliexpress_true_api", "aliexpress_unofficial"),
                "Gaming": ("csgo_matches_and_tournaments", "demo_project_v2", "dice_roll_simulator")}
    files += [f"{base}/toolenv/response_examples/{c}/{t}.json" for c, tools in examples.items() for t in tools]
    return files


# dataset -> files, each "<Repository>/<path in that repository>"
DATASETS: dict[str, list[str]] = {
    "stabletoolbench": _stabletoolbench_files(),
    "toolbench-examples": _toolbench_example_files(),
    "restbench": ["RestGPT/LICENSE", "RestGPT/datasets/tmdb.json", "RestGPT/specs/tmdb_oas.json"],
    "codetool": ["CodeTool/LICENSE.txt", "CodeTool/infer/tmdb/tmdb.data.candidate=20.v2.json",
                 "CodeTool/infer/tmdb/tmdb.spec.raw.v2.json"]
                + [f"CodeTool/StableToolBench/solvable_queries/filter_test_instruction/{g}.json" for g in _GROUPS],
}


def fetch_hint(path: str | Path) -> str:
    """The ``codetool data fetch ...`` command that gets the benchmark file ``path`` (a path ending
    in one of :data:`DATASETS`' files names its dataset; any other path gets the command that
    fetches every dataset), for error messages."""
    text = Path(path).as_posix()
    for name, files in DATASETS.items():
        if any(text == rel or text.endswith("/" + rel) for rel in files):
            return f"codetool data fetch {name}"
    return "codetool data fetch"


def _redact_codetool_spec(path: Path) -> None:
    """The upstream CodeTool TMDB spec embeds a bearer token; keep only a placeholder."""
    data = json.loads(path.read_text(encoding="utf-8"))
    headers = data.get("headers") if isinstance(data, dict) else None
    if isinstance(headers, dict) and "Authorization" in headers:
        headers["Authorization"] = "Bearer <REDACTED_TMDB_TOKEN>"
        path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")


def _write(target: Path, chunks) -> None:
    """Write ``chunks`` (bytes) to ``target`` through ``<target>.part`` and a rename, refusing a
    symbolic link at either name (a link planted there would send the data to the file it names)."""
    from codetool.jsonl import open_output

    if target.is_symlink():
        raise CodetoolError(f"{target} is a symbolic link (to {os.readlink(target)!r}); refusing to write through it. "
                            "Remove the link, then fetch again.")
    tmp = target.with_name(target.name + ".part")
    tmp.unlink(missing_ok=True)  # a leftover, or a planted link (removing a link is safe)
    try:
        with open_output(tmp) as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _copy(rel: str, source: Path, target: Path) -> bool:
    src = source / rel
    if not src.is_file():
        return False
    root, real = source.resolve(), src.resolve()
    if src.is_symlink() and not real.is_relative_to(root):
        raise CodetoolError(f"--from-dir: {src} is a symbolic link to {real}, outside {source}; refusing to copy "
                            "through it. Copy the file itself there, or fetch from another folder.")
    with open(real, "rb") as f:
        _write(target, iter(lambda: f.read(1 << 20), b""))
    return True


def _download(rel: str, target: Path, client) -> bool:
    repo_dir, _, path = rel.partition("/")
    url = f"https://raw.githubusercontent.com/{_REPOS[repo_dir]}/HEAD/{quote(path)}"  # some names hold '#'
    import httpx

    try:
        response = client.get(url)
    except httpx.ConnectError as e:  # no network (or no route to GitHub): every other file fails the same way
        raise CodetoolError(f"could not connect to {url.split('/')[2]} ({' '.join(str(e).split()) or type(e).__name__}): "
                            "no network here? Copy the files from a folder laid out like ../shared/data instead: "
                            "codetool data fetch ... --from DIR.") from None
    except Exception as e:  # other network errors (a timeout, a dropped read) are reported per file, not raised
        logger.warning("could not download %s: %s", url, type(e).__name__)
        return False
    if response.status_code != 200:
        logger.warning("could not download %s: HTTP %d", url, response.status_code)
        return False
    _write(target, [response.content])
    return True


def fetch(datasets: list[str], out: Path, from_dir: Path | None = None, timeout_s: float = 60.0,
          client=None) -> dict[str, dict[str, list[str]]]:
    """Copy or download ``datasets`` into ``out``.

    Args:
        from_dir (`Path`, *optional*): copy from this folder instead of downloading.
        client (`httpx.Client`, *optional*): the HTTP client for downloads (tests pass a mock one).

    Returns:
        ``{dataset: {"got": [relative paths], "missing": [relative paths]}}``. Datasets with nothing
        missing are recorded in ``out/.codetool-data.json``.

    Raises:
        CodetoolError: ``from_dir`` is no folder, or holds no file of any of ``datasets`` (a wrong
            folder, not a list of every file as missing); a download cannot connect (no network:
            the message suggests ``--from DIR``).
    """
    if from_dir is not None:
        if not from_dir.is_dir():
            raise CodetoolError(f"--from {from_dir}: the folder does not exist. Pass a folder laid out like "
                                "../shared/data (e.g. RestGPT/specs/tmdb_oas.json inside it).")
        if not any((from_dir / rel).is_file() for name in datasets for rel in DATASETS[name]):
            raise CodetoolError(f"--from {from_dir} holds none of the files of {', '.join(datasets)} (e.g. "
                                f"{from_dir / DATASETS[datasets[0]][0]}). Pass a folder laid out like ../shared/data.")
    out.mkdir(parents=True, exist_ok=True)
    own_client = from_dir is None and client is None
    if own_client:
        import httpx

        client = httpx.Client(timeout=timeout_s, follow_redirects=True)
    report: dict[str, dict[str, list[str]]] = {}
    try:
        for name in datasets:
            got: list[str] = []
            missing: list[str] = []
            for rel in DATASETS[name]:
                target = out / rel
                ok = _copy(rel, from_dir, target) if from_dir is not None else _download(rel, target, client)
                if ok and rel.endswith("tmdb.spec.raw.v2.json"):
                    _redact_codetool_spec(target)
                (got if ok else missing).append(rel)
            report[name] = {"got": got, "missing": missing}
            logger.info("%s: %d files, %d missing", name, len(got), len(missing))
    finally:
        if own_client:
            client.close()
    marker = out / MARKER
    done = json.loads(marker.read_text()) if marker.is_file() and not marker.is_symlink() else {}
    done.update({name: len(r["got"]) for name, r in report.items() if not r["missing"]})
    _write(marker, [json.dumps(done, indent=1, sort_keys=True).encode()])
    return report


def data_root() -> Path:
    """Where the benchmark files are.

    In order: ``./data`` when ``codetool data fetch`` wrote files there; ``$CODETOOL_DATA``; the
    ``shared/data`` folder next to the repository (the layout of our CI machines).

    Raises:
        CodetoolError: when none of them exists; the message says how to get the files.
    """
    local = Path("data")
    if (local / MARKER).is_file():
        return local
    env = os.environ.get("CODETOOL_DATA")
    if env:
        if not Path(env).is_dir():
            raise CodetoolError(f"CODETOOL_DATA={env} is not a folder. Point it at the folder that holds "
                                f"StableToolBench/, RestGPT/, ... or unset it.")
        return Path(env)
    shared = Path(__file__).resolve().parents[3] / "shared" / "data"
    if shared.is_dir():
        return shared
    raise CodetoolError("no benchmark data found (looked for ./data/.codetool-data.json, $CODETOOL_DATA and "
                        f"{shared}). Run 'codetool data fetch' (every dataset; "
                        "add '--from-dir DIR' to copy from a local folder) or set CODETOOL_DATA to the data folder.")
