"""The hidden-state probe of the decide-first stage: does this query need a tool? (When2Tool's Probe)

When2Tool (Sun et al., 2026, "LLM Agents Already Know When to Call Tools - Even Without
Reasoning", arXiv 2605.09252) reads tool necessity straight from the model: a logistic regression
with L2 penalty on the hidden states at the prompt's last token (every layer, the embedding output
included, concatenated), standardised per feature, predicts whether the model fails the task
without tools (AUROC 0.89-0.96 there). This module holds the three parts:

- :func:`last_token_states`: features of prompts from a local transformers model, ``(n, len(layers) *
  hidden_size)`` float32, one forward per prompt (``output_hidden_states``, logits of the last
  position only);
- :func:`fit_probe`: scikit-learn's ``StandardScaler`` + ``LogisticRegression`` (lbfgs, L2, ``C``);
- :class:`Probe`: the fitted numbers with the model id and the layer set, saved without pickle
  (``probe.safetensors``: coefficients and the scaler's mean and scale as float32 tensors;
  ``probe.json``: intercept, layers, model, settings) and applied with numpy:
  ``p = sigmoid((((x - mean) / scale) . w + b) / temperature)``.

**Which prompt.** The probe reads the policy's first-step prompt (:func:`probe_messages`): the
same prompt that Probe&Prefill continues with its prefill (:mod:`codetool.decide.router`), so the
state it reads is the state the reply starts from.

**vLLM.** vLLM's ``LLM`` API returns text, token log-probabilities and (for pooling models) one
pooled vector of the last layer; it exposes no per-layer hidden states of a generating model, so
the probe cannot read them from a vLLM (or any HTTP) backend. As When2Tool's own code does (it
decodes with vLLM and extracts features with transformers), the features then come from a
transformers copy of the same weights: set ``router.probe_model``.

Limits: one prompt per forward (exact, no padding; the probe's cost is then that of a prefill when
its forward is not shared with generation, see ``benchmarks/bench_probe_overhead.py``); the
features are float32 whatever the model dtype.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from codetool import CodetoolError
from codetool.search.prompt import policy_messages

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "probe.safetensors"
META_FILE = "probe.json"
FORMAT_VERSION = 1


def probe_messages(query: str, env, step_format: str = "code_only") -> list[dict[str, str]]:
    """The prompt the probe reads: the policy's first-step messages for ``query`` with ``env``'s tools."""
    return policy_messages(query, env.render(), [], step_format=step_format)


def resolve_layers(layers: Sequence[int] | str, n_states: int) -> list[int]:
    """Indices into ``hidden_states`` (0 = embedding output, ``n_states - 1`` = last layer).

    Args:
        layers (`Sequence[int]` or `str`): ``"all"`` (every state, When2Tool's setting) or indices,
            negative ones counted from the end (``-1`` is the last layer).
        n_states (`int`): number of hidden states the model returns (``num_hidden_layers + 1``).
    Raises:
        CodetoolError: an empty list or an index out of range.
    """
    if isinstance(layers, str):
        if layers != "all":
            raise CodetoolError(f"probe layers must be 'all' or a list of indices, got {layers!r}.")
        return list(range(n_states))
    out = []
    for layer in layers:
        index = int(layer) + n_states if int(layer) < 0 else int(layer)
        if not 0 <= index < n_states:
            raise CodetoolError(f"probe layer {layer} is out of range for a model with {n_states} hidden states "
                                f"(0 = embeddings .. {n_states - 1} = last layer; negative counts from the end).")
        out.append(index)
    if not out:
        raise CodetoolError("probe layers is empty; give 'all' or some layer indices.")
    return sorted(set(out))


def last_token_states(backend, prompts: Sequence[Any], layers: Sequence[int] | str = "all") -> np.ndarray:
    """Hidden states at the last prompt token, the chosen layers concatenated.

    Args:
        backend (`TransformersBackend`): a local model (``model``, ``encode``); the prompt is rendered
            with its chat template and the assistant header, as for generation.
        prompts (`Sequence[Prompt]`): strings or chat message lists.
        layers (`Sequence[int]` or `str`, *optional*, defaults to `"all"`): see :func:`resolve_layers`.
    Returns:
        (len(prompts), len(layers) * hidden_size) float32 array.
    Raises:
        CodetoolError: the backend has no local model (vLLM, HTTP, scripted).
    """
    import torch

    model = getattr(backend, "model", None)
    if model is None or not callable(getattr(backend, "encode", None)):
        raise CodetoolError(f"the probe reads hidden states from a local transformers model, and backend "
                            f"{getattr(backend, 'name', type(backend).__name__)!r} exposes none (vLLM and HTTP "
                            f"servers return no per-layer states): set router.probe_model to the same model as a "
                            f"local path or Hub id.")
    n_states = model.config.num_hidden_layers + 1
    chosen = resolve_layers(layers, n_states)
    rows = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([backend.encode(prompt)], dtype=torch.long, device=model.device)
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False, logits_to_keep=1)
            states = out.hidden_states
            rows.append(torch.cat([states[i][0, -1].float() for i in chosen]).cpu().numpy())
    if not rows:
        return np.zeros((0, len(chosen) * model.config.hidden_size), dtype=np.float32)
    return np.stack(rows).astype(np.float32)


@dataclass
class Probe:
    """A fitted tool-necessity probe: standardisation, then a logistic regression.

    Args:
        coef (`np.ndarray`): (d,) weights on standardised features.
        intercept (`float`): the bias.
        mean (`np.ndarray`), scale (`np.ndarray`): (d,) the scaler's feature means and standard
            deviations (a constant feature has scale 1, as scikit-learn sets it).
        layers (`list[int]`): hidden-state indices read, in order (0 = embeddings).
        n_states (`int`): hidden states of the model (``num_hidden_layers + 1``).
        hidden_size (`int`): width of one state; ``d == len(layers) * hidden_size``.
        model (`str`): the model the features came from (a name, path or Hub id).
        step_format (`str`): the policy prompt's step format the probe was trained on.
        C (`float`): scikit-learn's inverse L2 strength used in training.
        temperature (`float`, *optional*, defaults to `1.0`): divides the logit before the sigmoid
            (When2Tool's probe temperature; above 1 softens the probabilities).
        info (`dict`): what training recorded (counts, split, held-out AUROC).
    """

    coef: np.ndarray
    intercept: float
    mean: np.ndarray
    scale: np.ndarray
    layers: list[int]
    n_states: int
    hidden_size: int
    model: str
    step_format: str = "code_only"
    C: float = 1.0
    temperature: float = 1.0
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        d = len(self.layers) * self.hidden_size
        for name in ("coef", "mean", "scale"):
            value = np.asarray(getattr(self, name), dtype=np.float32).reshape(-1)
            if value.shape != (d,):
                raise CodetoolError(f"probe {name} has {value.shape[0]} values, expected {d} "
                                    f"({len(self.layers)} layers x {self.hidden_size}); the probe file is damaged.")
            setattr(self, name, value)
        if self.temperature <= 0:
            raise CodetoolError(f"probe temperature must be > 0, got {self.temperature}.")
        self._folded: tuple[np.ndarray, float] | None = None

    def logits(self, features: np.ndarray) -> np.ndarray:
        """(n,) logits of ``features`` (n, d) before the temperature."""
        x = np.asarray(features)
        if x.ndim != 2 or x.shape[1] != self.coef.shape[0]:
            raise CodetoolError(f"probe features must be (n, {self.coef.shape[0]}), got {x.shape}: the model or "
                                f"its layer set differs from the one the probe was trained on ({self.model}).")
        if self._folded is None:  # ((x - mean) / scale) . w + b == x . (w / scale) + (b - (mean / scale) . w)
            w = self.coef.astype(np.float64) / self.scale
            self._folded = (w, self.intercept - float(self.mean.astype(np.float64) @ w))
        w, b = self._folded
        return x.astype(np.float64, copy=False) @ w + b

    def predict(self, features: np.ndarray, temperature: float | None = None) -> np.ndarray:
        """(n,) P(tool necessary) in [0, 1] for ``features`` (n, d)."""
        t = self.temperature if temperature is None else temperature
        z = np.clip(self.logits(features) / t, -500, 500)
        return 1.0 / (1.0 + np.exp(-z))

    def save(self, folder: str | Path) -> Path:
        """Write ``probe.safetensors`` and ``probe.json`` into ``folder`` (no pickle); returns it."""
        from safetensors.numpy import save_file

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        save_file({"coef": self.coef, "mean": self.mean, "scale": self.scale}, str(out / WEIGHTS_FILE))
        meta = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("coef", "mean", "scale")}
        meta["format_version"] = FORMAT_VERSION
        tmp = out / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=float), encoding="utf-8")
        tmp.replace(out / META_FILE)
        return out

    @classmethod
    def load(cls, folder: str | Path) -> Probe:
        """Read a probe written by :meth:`save`.

        Raises:
            CodetoolError: a missing or unreadable file.
        """
        from safetensors.numpy import load_file

        folder = Path(folder)
        if not (folder / META_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            raise CodetoolError(f"no probe in {folder} (needs {META_FILE} and {WEIGHTS_FILE}); train one with "
                                f"`codetool train-probe --output {folder}`.")
        try:
            meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
            tensors = load_file(str(folder / WEIGHTS_FILE))
        except (OSError, ValueError) as e:
            raise CodetoolError(f"probe in {folder} is unreadable ({e}); train it again.") from None
        if meta.pop("format_version", None) != FORMAT_VERSION:
            raise CodetoolError(f"probe in {folder} has another format version; train it again.")
        return cls(coef=tensors["coef"], mean=tensors["mean"], scale=tensors["scale"], **meta)


def fit_probe(features: np.ndarray, labels: Sequence[int], *, C: float = 1e-3, max_iter: int = 2000,
              seed: int = 0, **meta) -> Probe:
    """Fit the probe with scikit-learn (``StandardScaler`` then L2 ``LogisticRegression``, lbfgs).

    Args:
        features (`np.ndarray`): (n, d) from :func:`last_token_states`.
        labels (`Sequence[int]`): (n,) 1 = tool necessary, 0 = not.
        C (`float`, *optional*, defaults to `1e-3`): inverse regularisation strength (When2Tool's
            all-layer probe uses a strength of 1e4, i.e. ``C = 1e-4``; few rows want a little less).
        **meta: the remaining :class:`Probe` fields (``layers``, ``n_states``, ``hidden_size``, ``model``, ...).
    Raises:
        CodetoolError: fewer than two rows or a single class.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    y = np.asarray(labels, dtype=int)
    if len(y) < 2 or len(set(y.tolist())) < 2:
        raise CodetoolError(f"the probe needs both labels among its training rows, got {len(y)} rows with labels "
                            f"{sorted(set(y.tolist()))}; label more queries (or mix tool-free ones in).")
    scaler = StandardScaler().fit(features)
    clf = LogisticRegression(C=C, solver="lbfgs", max_iter=max_iter, random_state=seed)
    clf.fit(scaler.transform(features), y)
    return Probe(coef=clf.coef_[0], intercept=float(clf.intercept_[0]), mean=scaler.mean_, scale=scaler.scale_,
                 C=C, **meta)


def auroc(scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
    """ROC AUC of ``scores`` for binary ``labels`` (Mann-Whitney with average ranks for ties, the
    function ``codetool eval-prm`` uses); NaN with a single class."""
    from codetool.prm.evaluate import roc_auc

    return roc_auc(scores, labels)


def auroc_interval(scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray, *, samples: int = 1000,
                   seed: int = 0, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of :func:`auroc`, resampling queries with replacement.

    Resamples with a single class are drawn again (they have no AUROC). ``None`` when the labels
    hold one class or there are fewer than 2 rows.
    """
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=int)
    if len(y) < 2 or len(set(y.tolist())) < 2:
        return None
    rng = np.random.default_rng(seed)
    values: list[float] = []
    tries = 0
    while len(values) < samples and tries < samples * 20:
        tries += 1
        pick = rng.integers(0, len(y), len(y))
        if y[pick].min() != y[pick].max():
            values.append(auroc(s[pick], y[pick]))
    lo, hi = np.quantile(values, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def check_model(probe: Probe, backend) -> None:
    """Refuse a model whose hidden states do not fit ``probe``; warn when its name differs.

    Raises:
        CodetoolError: another number of layers or another hidden size.
    """
    config = backend.model.config
    if config.num_hidden_layers + 1 != probe.n_states or config.hidden_size != probe.hidden_size:
        raise CodetoolError(f"the probe was trained on {probe.model} ({probe.n_states} hidden states of width "
                            f"{probe.hidden_size}), but the model here has {config.num_hidden_layers + 1} of width "
                            f"{config.hidden_size}: use the same model (router.probe_model) or train a probe for it.")
    name = getattr(backend, "name", "")
    if probe.model and probe.model not in name:
        logger.warning("the probe was trained on %s; reading hidden states of %s (same shapes)", probe.model, name)


def probe_decisions(backend, prompts: Sequence[Any], probe: Probe, cfg) -> list:
    """Probe&Prefill's decision for each prompt (the policy's first-step prompt, :func:`probe_messages`).

    Args:
        backend (`TransformersBackend`): the model whose hidden states the probe reads.
        prompts (`Sequence[Prompt]`): one per query.
        probe (`Probe`): the fitted probe.
        cfg (`RouterConfig`): ``t_probe`` and ``probe_temperature``.
    Returns:
        One :class:`~codetool.decide.stage.Decision` per prompt, ``method="probe"``: ``choice`` is
        ``NONE`` when ``p_tool < t_probe`` (confidence ``1 - p_tool``), else ``None`` (a tool is
        needed, the search picks which; confidence ``p_tool``). ``seconds`` is each query's share
        of the forwards; ``prompt_tokens`` the tokens read.
    """
    import time

    from codetool.decide.stage import NONE, Decision

    if not prompts:
        return []
    check_model(probe, backend)
    start = time.perf_counter()
    p = probe.predict(last_token_states(backend, prompts, probe.layers), cfg.probe_temperature or None)
    share = (time.perf_counter() - start) / len(prompts)
    out = []
    for prompt, value in zip(prompts, p.tolist(), strict=True):
        none = value < cfg.t_probe
        out.append(Decision(choice=NONE if none else None, confidence=1.0 - value if none else value, method="probe",
                            scores={NONE: 1.0 - value, "TOOL": value}, prompt_tokens=len(backend.encode(prompt)),
                            seconds=share, p_tool=value))
    return out
