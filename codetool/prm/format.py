"""The PRM prompt: one renderer, used by training and scoring alike (docs/DESIGN.md §3, §6).

A PRM example (query, tools, history, candidate step, candidate output) becomes two token runs:

- the **prefix**: chat-template head + query + tools + history. Every candidate of one search
  step has the same prefix, token for token, so the scorer computes it once and reuses its KV
  cache for all candidates. The history shows what the policy saw: a step whose output the
  policy was not shown (``search.observation_history: last``) has ``output: None`` and renders
  without it;
- the **suffix**: candidate code (+ the candidate's own output when ``candidate_output: show``)
  + the question + chat-template tail. The label token follows the suffix: the PRM's score is
  read at the suffix's last position.

``interface``: ``ours`` (default) is everything above; ``reference`` is the public CodeTool PRM's
interface (:mod:`codetool.prm.reference`: a system turn with the API docs, the earlier steps, the
parent's result and four criteria, the step as the user turn, ``yes``/``no`` as vocabulary words,
full-vocabulary SFT, the raw-logit ratio as the score).

``candidate_output``: the paper's PRM judges a step from the history (earlier steps and the
parent's output), before the step's own result is known; with its output in view the latent
reward largely repeats the on-the-spot reward. ``hide`` (default and the paper recipe) leaves
it out; ``show`` is the earlier behaviour. Checkpoints saved before the option existed load with
``show`` (:meth:`PRMFormat.from_saved`), so they score as they were trained.

The two runs are tokenised separately and concatenated, in training and in scoring, so both
paths see identical ids (``PromptEncoder.encode`` is the only way to get them).

Length: the prefix gets at most ``max_length - max_suffix_length - 1`` tokens and the suffix at
most ``max_suffix_length``, so a row never exceeds ``max_length`` and the prefix budget does not
depend on the candidate. Tool docs and outputs are first clipped to character limits; if the
prefix is still too long, the oldest history steps go first, then the tool docs shrink, then the
query; a long suffix loses output, then code. The end of the suffix (the label position) always
survives. Every budget-driven cut sets ``EncodedPrompt.truncated`` so callers can count them.

Text from the query, tools, code and outputs is tokenised with ``split_special_tokens=True``: a
tool output that contains ``<|im_end|>`` or a label token string cannot forge either. Secrets of
the environment (``codetool.secrets.redact``) are replaced before tokenising, so no API key
reaches a PRM prompt, in training or in scoring.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from codetool import prompts
from codetool.config import ConfigError, option
from codetool.jsonl import clean_text
from codetool.prm.encoded import EncodedPrompt, clip_text
from codetool.rewards import PRMItem
from codetool.secrets import redact

_SPLIT = "\x00PRM-SPLIT\x00"
_PLAIN_TAIL = "\nLabel: "
_MIN_CHARS = 200


@dataclass
class PRMFormat:
    """How PRM examples become token ids; saved with every checkpoint so scoring matches training.

    Args:
        max_length (`int`, *optional*, defaults to 2048): tokens per row, label token included.
        max_suffix_length (`int`, *optional*, defaults to 512): tokens for the candidate part.
        max_tools_chars (`int`, *optional*, defaults to 6000): tool docs are clipped to this first.
        max_output_chars (`int`, *optional*, defaults to 1500): each step output is clipped to this.
        chat_template (`bool`, *optional*, defaults to `True`): wrap the prompt in the tokenizer's
            chat template (a user turn, then the assistant turn opens); plain text otherwise.
        label_tokens (`list[str]`, *optional*): the positive ("more promising") and negative label.
        label_mode (`str`, *optional*, defaults to `"special"`): ``special`` adds the two strings
            as new special tokens (the paper's design); ``existing`` uses two strings that are
            already single tokens of the vocabulary (e.g. ``["+", "-"]``).
        candidate_output (`str`, *optional*, defaults to `"hide"`): ``show`` puts the candidate's
            own execution output in the suffix; ``hide`` leaves it out (the paper's PRM input).
        interface (`str`, *optional*, defaults to `"ours"`): ``ours`` or ``reference`` (the public
            PRM's prompt, label words, loss and score; label tokens default to ``yes``/``no``).
        reference_result_chars (`int`, *optional*, defaults to 2000): under ``reference``, the
            parent's output is cut to this many characters when scoring (whole in training).
    """

    max_length: int = option(2048, "tokens per PRM row, label token included")
    max_suffix_length: int = option(512, "token budget of the candidate part (code, output, question); not used "
                                    "by interface reference")
    max_tools_chars: int = option(6000, "tool docs are clipped to this many characters")
    max_output_chars: int = option(1500, "each step's output is clipped to this many characters")
    chat_template: bool = option(True, "wrap the prompt in the tokenizer's chat template")
    label_tokens: list[str] = option(default_factory=lambda: ["<|prm_pos|>", "<|prm_neg|>"],
                                     help="positive and negative label token")
    label_mode: str = option("special", "add the labels as new special tokens, or use existing ones",
                             choices=("special", "existing"))
    candidate_output: str = option("hide", "show the candidate's own execution output to the PRM, or hide it "
                                   "(the paper: the PRM judges the step from the history)", choices=("show", "hide"))
    interface: str = option("ours", "PRM interface: ours (our prompt, two label tokens, two-way loss, softmax) or "
                            "reference (the public CodeTool PRM: system prompt with API docs, earlier code, the "
                            "parent's result and four criteria; yes/no words; full-vocabulary SFT; score "
                            "logit_yes / (logit_yes + logit_no); no candidate token budget)",
                            choices=("ours", "reference"))
    reference_result_chars: int = option(2000, "interface reference: the parent's output is cut to this many "
                                         "characters when scoring (whole in training)")

    @classmethod
    def from_saved(cls, saved: dict) -> PRMFormat:
        """The format stored with a checkpoint; one saved before ``candidate_output`` existed was
        trained with the candidate's output shown, so it loads with ``show``."""
        return cls(**{"candidate_output": "show", **saved})

    def __post_init__(self):
        if self.interface not in ("ours", "reference"):
            raise ConfigError(f"format.interface must be ours or reference, got {self.interface!r}.")
        if self.interface == "reference" and list(self.label_tokens) == ["<|prm_pos|>", "<|prm_neg|>"]:
            self.label_tokens, self.label_mode = ["yes", "no"], "existing"  # the public PRM's answer words
        if len(self.label_tokens) != 2 or self.label_tokens[0] == self.label_tokens[1]:
            raise ConfigError(f"format.label_tokens: need two different strings, got {self.label_tokens!r}.")
        if self.interface == "ours" and (self.max_suffix_length < 32 or self.max_length - self.max_suffix_length < 64):
            raise ConfigError(
                f"format: max_length {self.max_length} and max_suffix_length {self.max_suffix_length} "
                "leave no room; keep max_suffix_length >= 32 and max_length >= max_suffix_length + 64.")

    @property
    def prefix_budget(self) -> int:
        """Tokens the prefix may use: ``max_length - max_suffix_length - 1`` (1 for the label)."""
        return self.max_length - self.max_suffix_length - 1


def render_history(history: list[dict], output_chars: int, dropped: int = 0) -> str:
    """The earlier chosen steps as text, oldest first; ``dropped`` leading steps are summarised. A
    step whose ``output`` is ``None`` (the policy was not shown it) renders its code alone."""
    parts = [f"[{dropped} earlier steps left out]"] if dropped else []
    for i, step in enumerate(history[dropped:], start=dropped + 1):
        plan = f"{step['plan']}\n" if step.get("plan") else ""  # step_text replies: the plan, then the code
        text = f"Step {i}:\n{plan}```python\n{step.get('code', '')}\n```"
        if step.get("output") is not None:
            text += f"\nOutput:\n{clip_text(str(step['output']), output_chars)}"
        parts.append(text)
    return "\n\n".join(parts) if parts else "(none yet)"


class PromptEncoder:
    """Render and tokenise PRM examples with one tokenizer and one :class:`PRMFormat`.

    Args:
        tokenizer (`PreTrainedTokenizerBase`): must already contain the label tokens
            (see ``codetool.prm.modeling.add_label_tokens``).
        fmt (`PRMFormat`): lengths, template choice and label tokens.
        training (`bool`, *optional*, defaults to `False`): rows for training (``interface:
            reference`` shows the parent's output whole there).

    Raises:
        CodetoolError: if a label token is not one token of ``tokenizer``.
    """

    def __init__(self, tokenizer, fmt: PRMFormat, training: bool = False):
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.prefix_name = "prm_prefix"
        self.suffix_name = "prm_suffix" if fmt.candidate_output == "show" else "prm_suffix_hidden"
        self.prefix_template = prompts.load(self.prefix_name).rstrip("\n")
        self.suffix_template = prompts.load(self.suffix_name).rstrip("\n")
        self.head, self.tail = self._wrapper()
        self.head_ids = self._special(self.head)
        self.tail_ids = self._special(self.tail)
        self.label_ids = label_token_ids(tokenizer, fmt)
        self._prefix_cache: dict[str, tuple[list[int], bool, int]] = {}
        self.reference = None
        if fmt.interface == "reference":
            from codetool.prm.reference import ReferencePrompt

            self.reference = ReferencePrompt(self, training, result_chars=fmt.reference_result_chars)

    def _wrapper(self) -> tuple[str, str]:
        if self.fmt.chat_template and getattr(self.tokenizer, "chat_template", None):
            wrapped = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": _SPLIT}], tokenize=False, add_generation_prompt=True)
            if isinstance(wrapped, str) and wrapped.count(_SPLIT) == 1:
                head, tail = wrapped.split(_SPLIT)
                return head, tail
            raise ConfigError("format.chat_template: the tokenizer's chat template does not insert the "
                              "user message verbatim; set format.chat_template false.")
        return "", _PLAIN_TAIL

    def _special(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def _text(self, text: str) -> list[int]:
        # clean_text: a lone surrogate from a tool or model makes the tokenizer raise (issue 19)
        return self.tokenizer.encode(clean_text(text), add_special_tokens=False, split_special_tokens=True)

    # -- prefix ---------------------------------------------------------------------------
    def encode_prefix(self, item: PRMItem) -> tuple[list[int], bool, int]:
        """``(prefix_ids, truncated, dropped_steps)`` for the item's query, tools and history."""
        key = json.dumps([item.query, item.tools, item.history], ensure_ascii=False, default=str)
        hit = self._prefix_cache.get(key)
        if hit is None:
            hit = self._build_prefix(item)
            if len(self._prefix_cache) > 256:
                self._prefix_cache.clear()
            self._prefix_cache[key] = hit
        return list(hit[0]), hit[1], hit[2]

    def _render_prefix(self, item: PRMItem, dropped: int, tools_chars: int, query_chars: int) -> list[int]:
        body = prompts.fill(self.prefix_template, {
            "query": clip_text(item.query, query_chars),
            "tools": clip_text(item.tools, tools_chars),
            "history": render_history(item.history, self.fmt.max_output_chars, dropped)},
            source=prompts.path_of(self.prefix_name))
        return self.head_ids + self._text(redact(body) + "\n")

    def _build_prefix(self, item: PRMItem) -> tuple[list[int], bool, int]:
        budget = self.fmt.prefix_budget
        tools_chars, query_chars = self.fmt.max_tools_chars, max(len(item.query), 1)
        ids = self._render_prefix(item, 0, tools_chars, query_chars)
        if len(ids) <= budget:
            return ids, False, 0
        dropped, ids = fewest_dropped_steps(self, item, budget, tools_chars, query_chars, ids)  # oldest first
        while len(ids) > budget and tools_chars > _MIN_CHARS:  # then the tool docs
            tools_chars //= 2
            ids = self._render_prefix(item, dropped, tools_chars, query_chars)
        while len(ids) > budget and query_chars > _MIN_CHARS:  # then the query
            query_chars //= 2
            ids = self._render_prefix(item, dropped, tools_chars, query_chars)
        if len(ids) > budget:  # last resort: keep the end, next to the candidate
            ids = ids[-budget:]
        return ids, True, dropped

    # -- suffix ---------------------------------------------------------------------------
    def _render_suffix(self, item: PRMItem, code_chars: int, output_chars: int) -> list[int]:
        fields = {"candidate_plan": f"{item.candidate_plan}\n" if item.candidate_plan else "",
                  "candidate": clip_text(item.candidate, code_chars)}
        if self.fmt.candidate_output == "show":  # prm_suffix_hidden.txt has no {candidate_output}
            fields["candidate_output"] = clip_text(item.candidate_output, output_chars)
        body = prompts.fill(self.suffix_template, fields, source=prompts.path_of(self.suffix_name))
        return self._text(redact(body)) + self.tail_ids

    def encode_suffix(self, item: PRMItem) -> tuple[list[int], bool]:
        """``(suffix_ids, truncated)``: the candidate part, ending where the label goes."""
        budget = self.fmt.max_suffix_length
        code_chars = max(len(item.candidate or ""), 1)
        output_chars = self.fmt.max_output_chars
        ids = self._render_suffix(item, code_chars, output_chars)
        if len(ids) <= budget:
            return ids, False
        while len(ids) > budget and output_chars > 100:  # the output goes first
            output_chars //= 2
            ids = self._render_suffix(item, code_chars, output_chars)
        while len(ids) > budget and code_chars > 100:  # then the code
            code_chars //= 2
            ids = self._render_suffix(item, code_chars, output_chars)
        if len(ids) > budget:  # keep the end: the question and the label position
            ids = ids[-budget:]
        return ids, True

    def encode(self, item: PRMItem) -> EncodedPrompt:
        """The token ids of one example (see the module docstring for the budgets)."""
        if self.reference is not None:
            return self.reference.encode(item)
        prefix, p_cut, dropped = self.encode_prefix(item)
        suffix, s_cut = self.encode_suffix(item)
        return EncodedPrompt(prefix, suffix, truncated=p_cut or s_cut, dropped_steps=dropped)

    def render_text(self, item: PRMItem) -> str:
        """The prompt as text (for logs, the SFT baseline and debugging); the label follows it."""
        enc = self.encode(item)
        return self.tokenizer.decode(enc.input_ids, skip_special_tokens=False)


def fewest_dropped_steps(encoder: PromptEncoder, item: PRMItem, budget: int, tools_chars: int,
                         query_chars: int, full_ids: list[int]) -> tuple[int, list[int]]:
    """The fewest oldest history steps to leave out so the prefix fits ``budget``, in linear time.

    Dropping steps one at a time and re-tokenising the whole prefix each time is quadratic in the
    history length (a 20,000-step history stalled ``serve-prm`` for minutes). Instead: every step
    renders to at least a few tokens, so steps beyond ``budget`` of them are dropped outright; the
    remaining steps are tokenised once each (in one batch) and the count is estimated by
    subtracting their token counts; a gallop then a binary search around the estimate settles the
    exact answer with a handful of renders (fitting is monotone in the number dropped). The result
    is the same ``dropped`` the one-at-a-time loop finds.

    Args:
        encoder (`PromptEncoder`): renders and tokenises the prefix.
        full_ids (`list[int]`): the prefix with nothing dropped (already over ``budget``).

    Returns:
        ``(dropped, prefix_ids)``; ``dropped == len(item.history)`` when no number of drops fits.
    """
    n = len(item.history)
    if n == 0:
        return 0, full_ids
    cache: dict[int, list[int]] = {0: full_ids}

    def ids_for(d: int) -> list[int]:
        if d not in cache:
            cache[d] = encoder._render_prefix(item, d, tools_chars, query_chars)
        return cache[d]

    def fits(d: int) -> bool:
        return len(ids_for(d)) <= budget

    # Each kept step costs >= 1 token, so at most `budget` steps can survive.
    low = max(0, n - budget)
    rendered = [render_history([step], encoder.fmt.max_output_chars) for step in item.history[low:]]
    counts = [len(x) for x in encoder.tokenizer(rendered, add_special_tokens=False,
                                                   split_special_tokens=True)["input_ids"]]
    excess = len(ids_for(low)) - budget if low else len(full_ids) - budget
    guess = low
    for c in counts:
        if excess <= 0 or guess >= n:
            break
        excess -= c
        guess += 1
    guess = min(max(guess, low), n)
    # Bracket [lo, hi] with fits(hi) true (or hi == n) and fits(lo - 1) false, then bisect.
    if fits(guess):
        hi, step = guess, 1
        lo = guess - 1
        while lo >= low and fits(lo):
            hi, lo = lo, lo - step
            step *= 2
        lo = max(lo + 1, low)
    else:
        lo, step = guess + 1, 1
        hi = min(guess + step, n)
        while hi < n and not fits(hi):
            lo, step = hi + 1, step * 2
            hi = min(hi + step, n)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi, ids_for(hi)


def label_token_ids(tokenizer, fmt: PRMFormat) -> tuple[int, int]:
    """``(positive_id, negative_id)`` of the label tokens in ``tokenizer``.

    Raises:
        ConfigError: if a label string is not exactly one token (for ``label_mode: special``,
            run ``add_label_tokens`` first; for ``existing``, choose single-token strings).
    """
    ids = []
    for text in fmt.label_tokens:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            fix = ("add them with codetool.prm.modeling.add_label_tokens" if fmt.label_mode == "special"
                   else "choose strings that are single tokens, or use label_mode: special")
            raise ConfigError(f"label token {text!r} is {len(encoded)} tokens {encoded} in this tokenizer; {fix}.")
        ids.append(encoded[0])
    return ids[0], ids[1]


def item_from_row(row: dict) -> PRMItem:
    """A :class:`PRMItem` from a PRM example row (docs/DESIGN.md §3); missing text fields are empty.

    Raises:
        ConfigError: if ``query`` is missing or ``history`` is not a list of code/output dicts.
    """
    if not isinstance(row, dict) or not isinstance(row.get("query"), str):
        raise ConfigError(f"a PRM row needs a text 'query' field; got keys {sorted(row) if isinstance(row, dict) else type(row).__name__}.")
    history = row.get("history") or []
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise ConfigError(f"PRM row 'history' must be a list of {{'code', 'output'}} dicts, got {type(history).__name__}.")
    return PRMItem(query=row["query"], tools=str(row.get("tools") or ""), history=history,
                   candidate=str(row.get("candidate") or ""), candidate_output=str(row.get("candidate_output") or ""),
                   candidate_plan=str(row.get("candidate_plan") or ""), step_text=str(row.get("step_text") or ""),
                   previous_steps=str(row.get("previous_steps") or ""),
                   parent_result=str(row.get("parent_result") or ""))
