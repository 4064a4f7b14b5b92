"""The public CodeTool PRM's interface (``format.interface: reference``), beside ours.

The public PRM (CodeTool ``src/rm_generative_data.py`` for its training rows,
``infer/step_infer.py`` and ``server/qwen_rm_server_generative.py`` for scoring) is a chat model
that answers one vocabulary word:

- a **system** turn that lists the API docs, then (after the first step) the code of the earlier
  steps and what the parent step's API requests returned, four judging criteria and the query;
  the **user** turn is the candidate step's reply with its stop word; the model answers ``yes`` or
  ``no`` (ordinary vocabulary words, not new tokens);
- it is trained with plain SFT on that answer word: the cross-entropy over the whole vocabulary
  (``PRMModel.full_vocab``), not over the two labels;
- its score is ``logit_yes / (logit_yes + logit_no)`` on the raw logits at the first answer
  position (:func:`label_scores`; not a probability: it can leave [0, 1] when the logits have
  different signs);
- the parent's output is shown whole in training and cut to its first 2,000 characters when
  scoring (``reference_result_chars``); the candidate part has no token budget of its own (ours:
  ``max_suffix_length``); only ``max_length`` bounds a row, and the API docs, then the earlier
  steps, then the parent's output give way first.

Our texts (``codetool/prompts/prm_reference_*.txt``) say the same four criteria in our words.
The training rows of ``label_rule: reference`` carry the fields it reads (``step_text``,
``previous_steps``, ``parent_result``); at scoring time the search fills them from its history
(the earlier chosen replies, each with its stop word, joined by the two characters ``/n`` as the
public search joins them; the parent's output from our run of it, in the public code's form).
``interface: ours`` is our prompt, our label tokens and the two-way loss and softmax
(:mod:`codetool.prm.format`, :mod:`codetool.prm.modeling`).
"""

from __future__ import annotations

from codetool import prompts
from codetool.config import ConfigError
from codetool.prm.encoded import EncodedPrompt, clip_text
from codetool.rewards import PRMItem
from codetool.secrets import redact

INTERFACES = ("ours", "reference")
REFERENCE_LABELS = ["yes", "no"]
_SYSTEM, _USER = "\x00PRM-SYSTEM\x00", "\x00PRM-USER\x00"
_PLAIN_MIDDLE, _PLAIN_TAIL = "\n\n", "\nAnswer: "
_MIN_CHARS = 200


def label_scores(logits, interface: str = "ours") -> list[float]:
    """Scores of ``(n, 2)`` label logits ``[positive, negative]``: ``reference`` divides the raw
    logits (``l_yes / (l_yes + l_no)``, the public server's formula), ``ours`` takes the softmax
    over the two."""
    import torch

    logits = logits.float()
    if interface == "reference":
        return (logits[:, 0] / (logits[:, 0] + logits[:, 1])).tolist()
    return torch.softmax(logits, dim=-1)[:, 0].tolist()


class ReferencePrompt:
    """Renders and tokenises PRM items as the public PRM reads them (module docstring).

    Args:
        encoder (`PromptEncoder`): gives the tokenizer, the format and the text helpers.
        training (`bool`, *optional*, defaults to `False`): rows for training show the parent's
            output whole; scoring cuts it to ``result_chars``.
        result_chars (`int`, *optional*, defaults to 2000): ``format.reference_result_chars``.
    Raises:
        ConfigError: the chat template cannot place a system and a user turn verbatim.
    """

    def __init__(self, encoder, training: bool = False, *, result_chars: int = 2000):
        self.encoder, self.fmt, self.training = encoder, encoder.fmt, training
        self.result_chars = result_chars  # format.reference_result_chars
        self.system = prompts.load("prm_reference_system").rstrip("\n")
        self.history = prompts.load("prm_reference_history").rstrip("\n") + "\n"
        head, middle, tail = self._wrapper()
        self.head_ids, self.middle_ids, self.tail_ids = (encoder._special(t) for t in (head, middle, tail))
        self._cache: dict[tuple, tuple[list[int], bool]] = {}

    def _wrapper(self) -> tuple[str, str, str]:
        tok = self.encoder.tokenizer
        if self.fmt.chat_template and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}],
                                           tokenize=False, add_generation_prompt=True)
            if isinstance(text, str) and text.count(_SYSTEM) == 1 and text.count(_USER) == 1 \
                    and text.index(_SYSTEM) < text.index(_USER):
                head, rest = text.split(_SYSTEM)
                middle, tail = rest.split(_USER)
                return head, middle, tail
            raise ConfigError("format.interface reference: the tokenizer's chat template does not put a system and "
                              "a user turn in verbatim; set format.chat_template false.")
        return "", _PLAIN_MIDDLE, _PLAIN_TAIL

    def _system_text(self, item: PRMItem, tools_chars: int, previous_chars: int, result_chars: int) -> str:
        history = ""
        if item.previous_steps:
            previous = item.previous_steps
            if len(previous) > previous_chars:  # the oldest steps give way
                previous = previous[len(previous) - previous_chars:]
            history = prompts.fill(self.history, {"previous_steps": previous,
                                                  "parent_result": item.parent_result[:result_chars]},
                                   source=prompts.path_of("prm_reference_history"))
        return prompts.fill(self.system, {"tools": clip_text(item.tools, tools_chars), "history": history,
                                          "query": item.query}, source=prompts.path_of("prm_reference_system"))

    def _prefix(self, item: PRMItem, budget: int) -> tuple[list[int], bool]:
        result_chars = len(item.parent_result) if self.training else self.result_chars
        key = (item.query, item.tools, item.previous_steps, item.parent_result[:result_chars], budget)
        if key in self._cache:
            ids, cut = self._cache[key]
            return list(ids), cut
        tools_chars, previous_chars = max(len(item.tools), 1), max(len(item.previous_steps), 1)

        def render() -> list[int]:
            text = self._system_text(item, tools_chars, previous_chars, result_chars)
            return self.head_ids + self.encoder._text(redact(text)) + self.middle_ids

        ids, cut = render(), False
        while len(ids) > budget and tools_chars > _MIN_CHARS:  # the API docs first
            tools_chars, cut = tools_chars // 2, True
            ids = render()
        while len(ids) > budget and previous_chars > _MIN_CHARS:  # then the earlier steps
            previous_chars, cut = previous_chars // 2, True
            ids = render()
        while len(ids) > budget and result_chars > _MIN_CHARS:  # then the parent's output
            result_chars, cut = result_chars // 2, True
            ids = render()
        if len(ids) > budget:  # last resort: the end, next to the candidate
            ids, cut = ids[-budget:], True
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[key] = (ids, cut)
        return list(ids), cut

    def encode(self, item: PRMItem) -> EncodedPrompt:
        """The token ids of one item: the system turn is the prefix (shared by the candidates of a
        step), the user turn and the assistant opening the suffix; the label follows."""
        suffix = self.encoder._text(redact(item.step_text)) + self.tail_ids
        cut = False
        room = self.fmt.max_length - 1 - 64  # a suffix longer than the row keeps its end
        if len(suffix) > room:
            suffix, cut = suffix[-room:], True
        prefix, prefix_cut = self._prefix(item, self.fmt.max_length - 1 - len(suffix))
        return EncodedPrompt(prefix, suffix, truncated=cut or prefix_cut)
