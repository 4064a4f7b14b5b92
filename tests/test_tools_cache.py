"""StableToolBench's response cache (``codetool.tools.cache``): its layout, canonical keys, and
the journal that write-through appends to."""

import json

from codetool.tools import APISpec, CacheBackend, Parameter

API = APISpec("Data", "TheClique", "Songkick concert", parameters=[Parameter("id_conc", required=True)])


def _write_stabletoolbench_cache(root):
    folder = root / "Data" / "theclique_for_Data"
    folder.mkdir(parents=True)
    # StableToolBench keys entries by str(tool_input): a Python repr.
    (folder / "songkick_concert.json").write_text(json.dumps({
        str({"a": 1, "b": "x"}): {"error": "", "response": "{\"name\": \"cached\"}"},
        str({"a": 2}): {"error": "Unauthorized", "response": ""},
        "not a dict": {"error": "", "response": "odd"}}))


def test_cache_replay_layout_and_canonical_keys(tmp_path):
    """Field case cache-key-order: a response cached for {'a': 1, 'b': 'x'} is hit by
    {'b': 'x', 'a': 1} and by {'a': '1', ...}."""
    _write_stabletoolbench_cache(tmp_path)
    cache = CacheBackend(tmp_path)
    assert cache.path_for(API) == tmp_path / "Data" / "theclique_for_Data" / "songkick_concert.json"
    for arguments in ({"a": 1, "b": "x"}, {"b": "x", "a": 1}, {"b": "x", "a": "1"}):
        hit = cache.call(API, arguments)
        assert hit.ok and hit.source == "cache" and hit.content == '{"name": "cached"}'
    assert cache.call(API, {"a": 2}).status == "api_error"
    assert cache.call(API, {"a": 3}).status == "not_found"


def test_write_through_appends_instead_of_rewriting_the_file(tmp_path):
    """Issue 27: each answer used to rewrite the API's whole JSON file (+14 MB a step with large
    arguments); now it is one journal line, folded in only once the journal outgrows the file."""
    cache = CacheBackend(tmp_path)
    big = "x" * 100_000
    cache.record(API, {"id_conc": "0"}, big)  # the first answer makes the JSON file
    path = cache.path_for(API)
    first_size = path.stat().st_size
    written = []
    for i in range(1, 8):
        before = path.stat().st_mtime_ns, path.stat().st_size
        cache.record(API, {"id_conc": str(i)}, big)
        written.append((path.stat().st_mtime_ns, path.stat().st_size) != before)
    assert written.count(True) <= 2 and path.stat().st_size < 8 * first_size  # folded at most geometrically
    fresh = CacheBackend(tmp_path)  # a reader sees file + journal
    assert all(fresh.lookup(API, {"id_conc": str(i)})["response"] == big for i in range(8))
    with open(path.with_name(path.name + ".journal"), "a") as f:
        f.write('{"key": "torn')  # a writer died mid-line
    assert CacheBackend(tmp_path).lookup(API, {"id_conc": "7"})["response"] == big
    cache.compact()
    assert len(json.loads(path.read_text())) == 8
