"""Shared fixtures. Everything is offline and CPU-only: the tiny model is built from a config and a
seed, its tokenizer read from a byte-level BPE frozen in ``tests/fixtures``, never downloaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models gain nothing from a second thread, and two threads on a busy 2-core machine wait on
# each other (measured 10x slower); set before torch is imported anywhere.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CODETOOL_SHARED_DATA", REPO.parent / "shared" / "data"))
# The field cases live in ../shared/cases; tests/cases is a copy so a clone alone still runs them.
SHARED_CASES = SHARED_DATA.parent / "cases"
if not SHARED_CASES.is_dir():
    SHARED_CASES = REPO / "tests" / "cases"
# Inputs and outputs of the reference code (StableToolBench, CodeTool, CoAgents) on them.
SHARED_CONFORMANCE = SHARED_DATA.parent / "conformance"
CANARY_KEY = "sk-canary-7f3a9c2e1b5d4f60a8e2"

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# The tiny tokenizer's vocabulary and merges, frozen: a byte-level BPE of 600 tokens (the three
# ChatML specials first) trained once with ``tokenizers.trainers.BpeTrainer`` on codetool/*.py at
# commit 8878d1c and one English line. It used to be retrained on the live package source at every
# session: an edit of any module could reorder merges of equal count and so renumber tokens, which
# gave every tiny-model test another model (test_prm_train's loss went from 0.32 to 0.67 after a
# refactor of three call sites; test_prm_scorer's score spread moved before, e026e44).
TINY_TOKENIZER = REPO / "tests" / "fixtures" / "tiny_tokenizer.json"


def build_tiny_tokenizer(out_dir: Path):
    """The tiny byte-level BPE tokenizer (``TINY_TOKENIZER``) with ChatML special tokens and chat
    template, saved to ``out_dir``: the same tokens whatever the package's source says."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(TINY_TOKENIZER)),
                                   bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", unk_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_model(out_dir: Path, *, tie_word_embeddings: bool = True, seed: int = 0):
    """A 2-layer Llama (hidden 32) with the tiny tokenizer, saved to ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tiny_tokenizer(out_dir)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=tie_word_embeddings, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Path of a saved tiny causal LM + tokenizer (tied embeddings, like SmolLM2)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_untied_model_dir(tmp_path_factory) -> Path:
    """Path of a saved tiny causal LM with untied input/output embeddings."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-untied"), tie_word_embeddings=False)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The benchmark files of ``../shared/data`` (skips the test where they are absent)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"benchmark data not found at {SHARED_DATA}; set CODETOOL_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def shared_conformance() -> Path:
    """The conformance corpus of ``../shared/conformance`` (skips the test where it is absent)."""
    if not SHARED_CONFORMANCE.is_dir():
        pytest.skip(f"conformance corpus not found at {SHARED_CONFORMANCE}")
    return SHARED_CONFORMANCE


@pytest.fixture(scope="session")
def shared_cases() -> Path:
    if not SHARED_CASES.is_dir():
        pytest.skip(f"field cases not found at {SHARED_CASES}")
    return SHARED_CASES


@pytest.fixture
def canary_env(monkeypatch):
    """Plant secret-looking keys in the environment; returns the canary value to grep for."""
    for name in ("TOOLBENCH_KEY", "OPENAI_API_KEY", "TMDB_ACCESS_TOKEN", "CODETOOL_JUDGE_API_KEY"):
        monkeypatch.setenv(name, CANARY_KEY)
    return CANARY_KEY


class STBConformance:
    """``shared/conformance/stabletoolbench``: the converted answers as trajectories and a judge that
    answers from ``stub_labels.json`` as the corpus's stub did (an answer found by its query and the
    first 200 characters of its final answer, with its chain where the request carries it)."""

    def __init__(self, root: Path):
        import json

        from codetool.eval.convert import import_converted
        from codetool.judge.records import ScriptedJudge, Verdict

        self.root = root
        self.stub = json.loads((root / "stub_labels.json").read_text())
        self.expected_pass = json.loads((root / "expected_pass_rate.json").read_text())
        self.expected_pref = json.loads((root / "expected_preference.json").read_text())
        self.groups = sorted(p.stem for p in (root / "test_ids").glob("*.json"))
        self.test_ids = {g: list(json.loads((root / "test_ids" / f"{g}.json").read_text())) for g in self.groups}
        self.runs = {run: {g: import_converted(root / "converted" / run / f"{g}.json") for g in self.groups}
                     for run in ("candidate", "reference")}
        by_answer: dict[tuple, set] = {}  # (query, final answer[:200]) -> {(run, qid)}
        by_whole: dict[tuple, tuple] = {}  # ... and str(answer_details) -> (run, qid)
        for run in self.runs:
            for g in self.groups:
                for qid, entry in json.loads((root / "converted" / run / f"{g}.json").read_text()).items():
                    answer = entry["answer"]
                    key = (entry["query"], answer["final_answer"][:200])
                    by_answer.setdefault(key, set()).add((run, qid))
                    by_whole[key + (str(answer["answer_details"]),)] = (run, qid)

        def whole(query: str, text: str) -> tuple[str, str]:
            data = json.loads(text)
            return by_whole[(query, data["final_answer"][:200], str(data["answer_details"]))]

        def label(req):
            stage = "answer" if req.trajectory is None else "details"
            found = by_answer[(req.query, req.answer[:200])] if req.trajectory is None else {whole(req.query,
                                                                                                   req.trajectory)}
            labels = {self.stub["answer_status"][run][qid][str(req.round)][stage] for run, qid in found}
            assert len(labels) == 1, f"the stub cannot tell {found} apart"
            return Verdict(labels.pop(), "stub")

        def winner(req):
            (run_a, qid), (run_b, _) = whole(req.query, req.details_a), whole(req.query, req.details_b)
            assert run_a != run_b and not req.allow_tie
            return "a" if self.stub["select_better_answer"][qid][str(req.round)] == run_a else "b"

        self.judge_factory = lambda: ScriptedJudge(label, winner, name="stub")

    def trajectories(self, run: str, group: str):
        """The run's trajectories of ``group`` that are test ids, in file order."""
        return [t for t in self.runs[run][group] if t.query_id in self.test_ids[group]]


@pytest.fixture(scope="session")
def stb_conformance(shared_conformance) -> STBConformance:
    return STBConformance(shared_conformance / "stabletoolbench")


# The executor test modules run each test under both isolation modes; bubblewrap is skipped where
# it cannot run. (A test that parametrizes its own ``mode`` overrides this fixture.)
EXECUTOR_MODES = ["fallback", pytest.param("bwrap", marks=pytest.mark.bwrap)]


@pytest.fixture(scope="module", params=EXECUTOR_MODES)
def mode(request):
    from codetool.executor import bwrap_problem

    if request.param == "bwrap" and bwrap_problem():
        pytest.skip(f"bubblewrap cannot run here: {bwrap_problem()}")
    return request.param


def kept_state_root(mode: str, config: dict, tools: dict | None = None):
    """The body of an executor test module's ``root`` fixture: an executor in ``mode`` under
    ``config`` whose state holds ``kept = 'state'`` (forks must carry it), closed at the end."""
    from codetool.executor import Executor, ExecutorConfig

    ex = Executor(ExecutorConfig(isolation=mode, **config), tools=tools)
    ex.run("kept = 'state'")
    yield ex
    ex.close()


def need(ex, layer: str) -> None:
    """Skip the test unless the executor ``ex`` runs with isolation layer ``layer``."""
    if layer not in ex.isolation:
        pytest.skip(f"needs the '{layer}' isolation layer; active: {ex.isolation}")
