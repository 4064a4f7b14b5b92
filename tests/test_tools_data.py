"""Fetching the benchmark files (codetool.tools.data): copy from a local folder, download (mocked
transport), report, marker."""

from __future__ import annotations

import json

import httpx
import pytest

from codetool import CodetoolError
from codetool.tools.data import DATASETS, MARKER, fetch


def test_fetch_copies_every_dataset(shared_data, tmp_path):
    out = tmp_path / "data"
    report = fetch(list(DATASETS), out, from_dir=shared_data)
    for name, files in DATASETS.items():
        assert report[name] == {"got": files, "missing": []}, name
        for rel in files:
            if not rel.endswith("tmdb.spec.raw.v2.json"):
                assert (out / rel).read_bytes() == (shared_data / rel).read_bytes(), rel
    assert json.loads((out / MARKER).read_text()) == {name: len(files) for name, files in DATASETS.items()}
    # The manifest covers every file of the offline copy.
    listed = {rel for files in DATASETS.values() for rel in files}
    present = {str(p.relative_to(shared_data)) for p in shared_data.rglob("*") if p.is_file()} - {"README.md"}
    assert listed == present


def test_fetch_reports_missing_files(shared_data, tmp_path):
    partial = tmp_path / "partial"
    (partial / "RestGPT" / "datasets").mkdir(parents=True)
    (partial / "RestGPT" / "datasets" / "tmdb.json").write_text("[]")
    report = fetch(["restbench"], tmp_path / "out", from_dir=partial)
    assert report["restbench"]["got"] == ["RestGPT/datasets/tmdb.json"]
    assert report["restbench"]["missing"] == ["RestGPT/LICENSE", "RestGPT/specs/tmdb_oas.json"]
    assert json.loads((tmp_path / "out" / MARKER).read_text()) == {}  # incomplete datasets are not recorded


def test_download_uses_upstream_raw_urls_and_redacts_the_token(tmp_path):
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        if request.url.path.endswith("tmdb.spec.raw.v2.json"):
            return httpx.Response(200, json={"headers": {"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.real"},
                                             "endpoints": []})
        if request.url.path.endswith("LICENSE.txt"):
            return httpx.Response(200, text="MIT")
        return httpx.Response(404, text="404: Not Found")

    client = httpx.Client(transport=httpx.MockTransport(handler))
    report = fetch(["codetool"], tmp_path, client=client)
    assert report["codetool"]["got"] == ["CodeTool/LICENSE.txt", "CodeTool/infer/tmdb/tmdb.spec.raw.v2.json"]
    assert len(report["codetool"]["missing"]) == 7
    assert "https://raw.githubusercontent.com/LimOkii/CodeTool/HEAD/infer/tmdb/tmdb.spec.raw.v2.json" in asked
    spec = (tmp_path / "CodeTool/infer/tmdb/tmdb.spec.raw.v2.json").read_text()
    assert "eyJhbGci" not in spec and "<REDACTED_TMDB_TOKEN>" in spec


def test_a_source_folder_that_is_absent_or_holds_no_file_of_the_datasets_is_refused(tmp_path):
    with pytest.raises(CodetoolError, match="the folder does not exist"):
        fetch(["codetool"], tmp_path / "out", from_dir=tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CodetoolError, match=r"holds none of the files of codetool, restbench \(e\.g\. .*LICENSE"):
        fetch(["codetool", "restbench"], tmp_path / "out", from_dir=tmp_path / "empty")
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_no_network_stops_at_once_and_suggests_from_dir(tmp_path):
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url)
        raise httpx.ConnectError("[Errno -3] Temporary failure in name resolution", request=request)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    with pytest.raises(CodetoolError, match=r"could not connect to raw\.githubusercontent\.com \(\[Errno -3\] "
                                            r"Temporary failure in name resolution\): no network here\?.*--from DIR"):
        fetch(["codetool"], tmp_path, client=client)
    assert len(asked) == 1  # not once per file
