"""PRM datasets: rows (read by :mod:`codetool.prm.rows`) in, pre-tokenised training rows out,
and the batch collator.

A training row is ``input_ids = prefix + suffix + [label]`` with ``labels`` equal to -100
everywhere except the last position, which holds the label token id: exactly one supervised
token per row (TRL's convention for completion-only SFT, without the EOS that prompt/completion
rows would add; DESIGN.md §6). Rows never lose their label to truncation: the prompt is cut
instead (``codetool.prm.format``) and the number of cut rows is logged.

Splits are by ``query_id`` (all candidates of one query land on the same side), by
:func:`codetool.split.heldout_query_ids` (the split tree export uses too), so ``codetool eval-prm``
can rebuild the held-out part from the checkpoint's settings. Siblings (the
candidates of one step) are the rows that share query and history; they form the pairs of the
pairwise accuracy. In training the rows of one query share its prompt and siblings share their
history: :class:`PrefixGroupSampler` keeps a query's rows in the same batches and
``PRMModel.forward(..., share_prefix=True)`` computes each shared run of tokens once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import torch

from codetool import CodetoolError
from codetool.prm.evaluate import row_pair_ids
from codetool.prm.format import PromptEncoder, item_from_row
from codetool.prm.rows import query_key
from codetool.split import heldout_query_ids

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


def split_rows(rows: list[dict], fraction: float, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)`` by query (:func:`codetool.split.heldout_query_ids` over the rows'
    :func:`query_key`: the split that tree export writes as ``validation.jsonl``)."""
    held = heldout_query_ids((query_key(row) for row in rows), fraction, seed)
    train: list[dict] = []
    heldout: list[dict] = []
    for row in rows:
        (heldout if query_key(row) in held else train).append(row)
    return train, heldout


def sibling_key(row: dict) -> str:
    """Rows with the same key are candidates of the same step (same query and history)."""
    return json.dumps([query_key(row), row.get("history") or []], sort_keys=True, default=str)


@dataclass
class TokenStats:
    """Counts from :func:`tokenize_rows`: rows, rows cut to fit, history steps dropped, tokens, and
    rows left out as one input under two labels (``same_input``)."""

    rows: int = 0
    truncated: int = 0
    dropped_steps: int = 0
    tokens: int = 0
    same_input: int = 0


def tokenize_rows(rows: list[dict], encoder: PromptEncoder) -> tuple[list[dict], TokenStats]:
    """Pre-tokenise rows for training and evaluation.

    Returns:
        A list of dicts with ``input_ids`` (list[int], prompt then label token), ``labels``
        (-100 except the last position), ``group`` (int, sibling group index), ``query_group``
        (int, index of the row's query: its rows share the query and tool prompt), ``label``
        (0/1), ``pair`` (int, index of its labelled pair, -1 none) and ``ok`` (1 its step ran, 0
        failed, -1 unknown), plus :class:`TokenStats`. Truncated rows are logged, never dropped.
        Every labelled pair holding an input that carries both labels (the two rows of one pair
        encoded alike, or one input labelled 1 in a pair and 0 in another) is left out, its rows
        counted in ``same_input`` and logged: no PRM can score such rows apart, so they would teach
        nothing and score as a coin.
    """
    pos_id, neg_id = encoder.label_ids
    groups: dict[str, int] = {}
    queries: dict[str, int] = {}
    pair_ids, ok = row_pair_ids(rows, [sibling_key(r) for r in rows])
    pairs: dict = {}
    out, stats = [], TokenStats()
    for row, pid, ran in zip(rows, pair_ids, ok):
        enc = encoder.encode(item_from_row(row))
        label_id = pos_id if row["label"] == 1 else neg_id
        ids = enc.input_ids + [label_id]
        out.append({"input_ids": ids, "labels": [IGNORE_INDEX] * (len(ids) - 1) + [label_id],
                    "query_group": queries.setdefault(query_key(row), len(queries)),
                    "group": groups.setdefault(sibling_key(row), len(groups)), "label": int(row["label"]),
                    "pair": -1 if pid in (-1, None) else pairs.setdefault(pid, len(pairs)), "ok": int(ran)})
        stats.rows += 1
        stats.tokens += len(ids)
        stats.truncated += int(enc.truncated)
        stats.dropped_steps += enc.dropped_steps
    if stats.truncated:
        logger.warning("%d of %d PRM rows were cut to fit max_length %d (%d history steps left out); "
                       "their labels are kept", stats.truncated, stats.rows, encoder.fmt.max_length,
                       stats.dropped_steps)
    return _without_same_input(out, stats)


def _without_same_input(out: list[dict], stats: TokenStats) -> tuple[list[dict], TokenStats]:
    """:func:`tokenize_rows` without the labelled pairs that hold an input carrying both labels: the
    two rows of one pair that encode alike, or one input labelled 1 in a pair and 0 in another (the
    children of two sibling samples of one step, "cousin twins", or steps the format renders alike,
    e.g. the same code with another observation when outputs are hidden)."""
    bad = pairs_with_both_labels([row["input_ids"][:-1] for row in out], [row["label"] for row in out],
                                 [row["pair"] if row["pair"] >= 0 else None for row in out])
    if not bad:
        return out, stats
    kept = [row for row in out if row["pair"] not in bad]
    stats.same_input = len(out) - len(kept)
    logger.warning("%d of %d labelled pairs left out: they hold an input the PRM reads under both labels (one step "
                   "sampled twice, in one sibling pair or in two: 'codetool build-trees --relabel' drops sibling "
                   "twins as same_step; or two steps the format renders alike: raise format.max_length)",
                   len(bad), len({row["pair"] for row in out if row["pair"] >= 0}))
    return kept, stats


def pairs_with_both_labels(inputs: list, labels: list[int], pair_ids: list) -> set:
    """The pair ids (``None``: a row of no pair) of the labelled pairs that hold an input carrying
    both labels among the paired rows (``inputs``: per row its token ids or any sequence the PRM
    reads). ``train-prm`` leaves them out of training and validation, ``eval-prm`` out of its pairs."""
    seen: dict[tuple, set[int]] = {}
    for key, label, pid in zip(inputs, labels, pair_ids):
        if pid is not None:
            seen.setdefault(tuple(key), set()).add(int(label))
    both = {key for key, kinds in seen.items() if len(kinds) == 2}
    return {pid for key, pid in zip(inputs, pair_ids) if pid is not None and tuple(key) in both}


class PRMCollator:
    """Batch pre-tokenised rows for :class:`codetool.prm.modeling.PRMModel`.

    Args:
        label_ids (`tuple[int, int]`): positive and negative label token ids.
        pad_id (`int`): id used for right padding (never attended to by real tokens).

    Returns (per call) a dict of tensors: ``input_ids`` (batch, longest - 1) without the label
    token, ``last_index`` (batch,) the position that predicts the label, ``target`` (batch,)
    0 for the positive label and 1 for the negative (the index among the two label logits),
    ``group``, ``pair``, ``ok``, ``query`` (batch,) the row's sibling group, labelled pair, whether
    its step ran and its query index (-1: unknown), for the evaluation metrics.

    Raises:
        CodetoolError: if a row does not have exactly one supervised token, at its end, holding a
            label id (e.g. rows built with another tokenizer or with a mask cast to bool). A batch
            without supervision is therefore impossible, never a silent 0.0 or NaN loss.
    """

    def __init__(self, label_ids: tuple[int, int], pad_id: int):
        self.label_ids = tuple(label_ids)
        self.pad_id = int(pad_id)

    def _check(self, feature: dict) -> int:
        labels = [int(x) for x in feature["labels"]]
        supervised = [i for i, x in enumerate(labels) if x != IGNORE_INDEX]
        if supervised != [len(labels) - 1] or labels[-1] not in self.label_ids:
            raise CodetoolError(
                f"a PRM training row must supervise exactly one token, the last, holding a label id "
                f"{self.label_ids}; got {len(supervised)} supervised positions {supervised[:5]} with "
                f"values {[labels[i] for i in supervised[:5]]}. Rebuild the rows with codetool.prm.data.tokenize_rows.")
        return self.label_ids.index(labels[-1])

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if not features:
            raise CodetoolError("an empty batch reached the PRM collator; check the dataset size.")
        targets = [self._check(f) for f in features]
        prompts = [list(f["input_ids"][:-1]) for f in features]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        batch = {"input_ids": input_ids,
                 "last_index": torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long),
                 "target": torch.tensor(targets, dtype=torch.long),
                 "group": torch.tensor([int(f.get("group", -1)) for f in features], dtype=torch.long),
                 **{key: torch.tensor([int(f.get(key, -1)) for f in features], dtype=torch.long)
                    for key in ("pair", "ok")},
                 "query": torch.tensor([int(f.get("query_group", -1)) for f in features], dtype=torch.long)}
        return batch


class PrefixGroupSampler(torch.utils.data.Sampler):
    """Training order in which the rows of a group (a query) fill whole batches together.

    The data loader cuts this order into consecutive batches of ``batch_size``, so the order is
    built batch by batch: each group gives as many full batches of its own rows as it can (rows in
    dataset order, where siblings are adjacent); the remainders (groups smaller than a batch, and
    what is left of larger ones) are laid out largest first and cut into batches, so few of them
    are split. The batches are then shuffled (seeded by ``seed`` and the epoch); only the last may
    be short. Sharing is an optimisation: a split group only shares less.

    Args:
        groups (`list[int]`): group id of each dataset row (``query_group`` of :func:`tokenize_rows`).
        lengths (`list[int]`): tokens of each row (the remainders' order breaks ties by length).
        batch_size (`int`): rows per batch of the data loader (per process).
        seed (`int`, *optional*, defaults to 0): base shuffling seed.
    """

    def __init__(self, groups: list[int], lengths: list[int], batch_size: int, seed: int = 0):
        if len(groups) != len(lengths):
            raise CodetoolError(f"PrefixGroupSampler: {len(groups)} group ids for {len(lengths)} rows.")
        members: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            members.setdefault(int(g), []).append(i)
        self.members = list(members.values())
        self.lengths = [int(n) for n in lengths]
        self.batch_size = max(int(batch_size), 1)
        self.seed, self.epoch = int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        """Called by the Trainer (through accelerate) at the start of each epoch."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.lengths)

    def batches(self) -> list[list[int]]:
        """This epoch's batches of row indices, in order."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        size = self.batch_size
        groups = [self.members[i] for i in torch.randperm(len(self.members), generator=generator).tolist()]
        batches, rest = [], []
        for group in groups:
            full = len(group) - len(group) % size
            batches += [group[i: i + size] for i in range(0, full, size)]
            if full < len(group):
                rest.append(group[full:])
        rest.sort(key=lambda g: (-len(g), -max(self.lengths[i] for i in g)))
        flat = [i for g in rest for i in g]
        batches += [flat[i: i + size] for i in range(0, len(flat), size)]
        short = [b for b in batches if len(b) < size]
        batches = [b for b in batches if len(b) == size]
        order = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[i] for i in order] + short

    def __iter__(self):
        return iter([i for batch in self.batches() for i in batch])
