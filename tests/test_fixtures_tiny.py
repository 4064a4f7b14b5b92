"""The tiny models' tokenizer (tests/conftest.py) is frozen: its tokens never follow the package's
source, so an edit of a module cannot hand every tiny-model test another model."""

from __future__ import annotations

import conftest


def test_the_tiny_tokenizer_keeps_its_tokens_whatever_the_package_source_says(tmp_path, monkeypatch):
    """Before: the BPE was retrained on codetool/*.py at every session, so moving a few lines of
    code reordered merges of equal count and renumbered tokens (test_prm_train's loss after
    training went from 0.32 to 0.67 with three call sites refactored)."""
    other = tmp_path / "repo"
    (other / "codetool").mkdir(parents=True)
    (other / "codetool" / "mod.py").write_text("def score_items(scorer, items):\n    return scorer.score(items)\n")
    monkeypatch.setattr(conftest, "REPO", other)  # a package whose source says something else
    tok = conftest.build_tiny_tokenizer(tmp_path / "tok")
    assert len(tok) == 600 and tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    ids = tok("def score(self, items):")["input_ids"]  # numbered as tests/fixtures/tiny_tokenizer.json says
    assert tok.convert_ids_to_tokens(ids) == ["def", "Ġs", "co", "re", "(", "self", ",", "Ġit", "em", "s", "):"]
    assert ids == [352, 300, 364, 262, 10, 409, 14, 417, 454, 85, 346]
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n" and tok(chat)["input_ids"] == [1, 510, 269, 201, 74, 75, 2, 201]
