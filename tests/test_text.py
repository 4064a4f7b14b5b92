"""``codetool.text``: lone surrogates become U+FFFD; everything else is left as it was."""

from __future__ import annotations

from codetool import jsonl, text
from codetool.text import clean_obj, clean_text


def test_clean_text_replaces_lone_surrogates_and_joins_pairs():
    assert clean_text("plain é") == "plain é"
    assert clean_text("a\ud800b") == "a\ufffdb"
    assert clean_text("\ud83d\ude00") == "\U0001f600"  # a valid pair written as two surrogates
    assert clean_text("x\udfffy\ud800").encode("utf-8") == "x\ufffdy\ufffd".encode()


def test_clean_obj_walks_keys_values_lists_and_tuples():
    assert clean_obj({"k\ud800": ["v\ud800", ("t\ud800", 1)], "n": None}) == {
        "k\ufffd": ["v\ufffd", ["t\ufffd", 1]], "n": None}
    assert clean_obj(3.5) == 3.5


def test_the_old_import_path_still_works():
    assert jsonl.clean_text is text.clean_text and jsonl.clean_obj is text.clean_obj
