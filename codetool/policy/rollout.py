"""Rollouts: multi-step episodes in our executor and tool environment, as GRPO rows.

Every episode of a batch advances one step per round, as in the search: the policy samples one
step for each active episode (all in one ``generate`` call; a round-0 group of ``num_generations``
copies of one prompt is one prompt with ``n`` samples), each step runs in its episode's own
executor (a fresh sandbox family per episode: siblings of a group cannot reach each other's state
to lower their rewards) and is read, run, rewarded on the spot and shown by the search's own
function (:func:`codetool.search.step.run_step`, under the same :class:`~codetool.search.config.StepGroup`
settings, ``observation_cut`` and constrained decoding included), and the episode ends on
``finish``/``give_up``, after ``max_steps``, on a host error or on a step the executor could not run
(``not_executed``: the episode is then dropped from its GRPO group, ``Episode.dropped``).

Token rows (see :mod:`codetool.policy.episode`): the first prompt is the search's prompt,
tokenised as the search's backend tokenises it; after a step, the row grows by the ids the
policy sampled and then by the ids of exactly the text the search's next prompt adds (the rest
of the closing fence, the observation turn, the next assistant header), so the row's text is the
search's rendering of every later prompt and the policy always samples from the row itself (no
re-tokenisation between sampling and training). A trailing end-of-turn id of a step that does not
end the episode is dropped (the template closes the turn). Observation text (sandbox output) is
tokenised with ``split_special_tokens=True``: printing ``<|im_end|>`` cannot forge a turn.

Limits: needs a chat template that renders a longer conversation as an extension of a shorter
one (ChatML, Llama, Qwen do) and ``observation_history: all`` (a row cannot un-show an earlier
output); a step whose generated text runs past what the search keeps (e.g. a token that holds
the closing fence plus a newline) leaves the row's text one or two characters off the search's
(``EpisodeStep.exact`` False, counted in the logs).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from codetool import CodetoolError
from codetool.models.completion import Completion, find_stop
from codetool.resume import unit_seed
from codetool.rewards import not_executed
from codetool.search.expand import step_constraint
from codetool.search.prompt import policy_messages
from codetool.search.step import prefixed, reply_lead, reply_text, run_step, stop_words
from codetool.secrets import redact

from .episode import Episode, EpisodeStep

logger = logging.getLogger(__name__)

_SENTINEL = "\x00CODETOOL-OBSERVATION\x00"


class StepGenerator(Protocol):
    """What samples a step: ``generate(rows, n, ...)`` from token-id prompts, ``n`` completions per
    row, each with its ``token_ids`` (:class:`~codetool.models.completion.Completion`)."""

    def generate(self, rows: list[list[int]], n: int, *, constraints: list, stop: list[str] | None,
                 max_new_tokens: int, seed: int) -> list[list[Completion]]: ...


class LocalGenerator:
    """Steps from a local transformers model (the model being trained) through the search's backend:
    shared prefill of a group's prompt, a prompt KV cache across the rounds of one rollout
    (cleared by :meth:`begin`: the weights change between rollouts), constrained decoding.

    Args:
        model, tokenizer: the policy (put in eval mode while it generates).
        temperature, top_p (`float`): sampling (GRPO's, so the trained log-probs match).
        max_batch_size (`int`, *optional*, defaults to 8): sequences decoded together.
    """

    def __init__(self, model, tokenizer, *, temperature: float, top_p: float, max_batch_size: int = 8,
                 prompt_cache_mb: float = 512):
        from codetool.models.transformers_backend import TransformersBackend

        self.backend = TransformersBackend((model, tokenizer), max_batch_size=max_batch_size,
                                           prompt_cache_mb=prompt_cache_mb)
        self.temperature, self.top_p = temperature, top_p

    def begin(self, model=None) -> None:
        """Start a rollout (with ``model``, the current weights, when given)."""
        if model is not None:
            self.backend.model = model
        self.backend.prompt_cache.clear()

    def generate(self, rows, n, *, constraints, stop, max_new_tokens, seed):
        model = self.backend.model
        training = model.training
        model.eval()
        try:
            return self.backend.generate_ids(rows, n=n, temperature=self.temperature, top_p=self.top_p,
                                             max_new_tokens=max_new_tokens, stop=stop, seed=seed,
                                             constraint=constraints)
        finally:
            model.train(training)


@dataclass
class RolloutStats:
    """Seconds and counts of the rollouts so far (the benchmark's split and the logs)."""

    generation_s: float = 0.0
    execution_s: float = 0.0
    episodes: int = 0
    steps: int = 0
    inexact_steps: int = 0
    generated_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class EpisodeRunner:
    """Run batches of episodes (one per task given; repeat a task for a GRPO group).

    Args:
        tokenizer: the policy's tokenizer (chat template).
        cfg (`StepGroup`): step format, observation cut, ``max_steps``, ``max_new_tokens``,
            constrained decoding, ``tool_error_is_failure``, ``cost_table`` (``train-policy``'s ``rollout:``).
        make_executor (`Callable[[SearchTask], StepExecutor]`): a fresh executor per episode.
        seed (`int`, *optional*, defaults to 0): base of every round's sampling seed.
        max_positions (`int`, *optional*): an episode whose row would outgrow this ends (``max_steps``).
        lockstep (`bool`, *optional*, defaults to `False`): run every round even when no episode is
            left (a vLLM generator on several processes needs the same number of calls everywhere).
        workers (`int`, *optional*, defaults to 1): steps of a round executed at once (threads; the
            sandboxes are separate processes and tool calls wait on I/O, e.g. a StableToolBench server).
    Raises:
        CodetoolError: ``observation_history`` is not ``all``.
    """

    def __init__(self, tokenizer, cfg, make_executor, *, seed: int = 0, max_positions: int | None = None,
                 lockstep: bool = False, workers: int = 1):
        if cfg.observation_history != "all":
            raise CodetoolError(f"rollout.observation_history is {cfg.observation_history!r}: an episode row cannot "
                                "hide an output it already showed; use all for rollouts.")
        self.tokenizer, self.cfg, self.make_executor, self.seed = tokenizer, cfg, make_executor, seed
        self.lockstep, self.workers = lockstep, max(int(workers), 1)
        self._lock = threading.Lock()
        self.max_positions = max_positions or 10**9
        self.prefixed, self.stop, self.lead = prefixed(cfg), stop_words(cfg), reply_lead(cfg)
        self.stats = RolloutStats()
        eos = tokenizer.eos_token_id
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or [])

    # ------------------------------------------------------------------ rendering
    def messages(self, task, history: list[dict], *, reply_only: bool = False) -> list[dict]:
        """The search's messages for the step after ``history`` (``reply_only``: up to the last reply)."""
        msgs = policy_messages(task.query, task.env.render(), history, step_format=self.cfg.step_format,
                               observation_history=self.cfg.observation_history)
        if reply_only:
            return msgs[:-1]
        return msgs + [{"role": "assistant", "content": self.lead}] if self.lead else msgs

    def render(self, messages: list[dict]) -> str:
        """The text the search's transformers backend encodes for ``messages``."""
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return "\n\n".join(m["content"] for m in messages)
        if messages[-1]["role"] == "assistant":
            return tok.apply_chat_template(messages, continue_final_message=True, tokenize=False)
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode(self, text: str, *, untrusted: bool = False) -> list[int]:
        """Token ids of ``text``; ``untrusted`` text (sandbox output, code) never yields special ids."""
        if not text:
            return []
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=untrusted)["input_ids"]

    # ------------------------------------------------------------------ the rollout
    def run(self, tasks: list, generator: StepGenerator, *, step_key: Any = 0) -> list[Episode]:
        """One episode per task, all advanced together; returns them in task order.

        Args:
            step_key (`Any`, *optional*): mixed into the sampling seeds (the trainer passes its global step).
        """
        episodes, states, rendered = [], [], []
        for task in tasks:
            text = self.render(self.messages(task, []))
            episodes.append(Episode(task=task, prompt_ids=self.encode(text)))
            rendered.append(text)
            try:
                states.append(self.make_executor(task))
            except Exception as exc:  # noqa: BLE001 - this episode ends as an error, the batch goes on
                states.append(None)
                self._fail(episodes[-1], exc)
        try:
            for round_index in range(self.cfg.max_steps):
                active = [i for i, e in enumerate(episodes) if e.finish_type == "max_steps" and not e.capped
                          and len(e.steps) == round_index]
                if not active and self.lockstep:  # the others still call: call too, drop the result
                    generator.generate([episodes[0].prompt_ids], 1, constraints=[None], stop=self.stop,
                                       max_new_tokens=self.cfg.max_new_tokens, seed=0)
                    continue
                if not active:
                    break
                self._round(episodes, states, rendered, active, generator, step_key, round_index)
        finally:
            for state in states:
                if state is not None:
                    state.close()
        self.stats.episodes += len(episodes)
        return episodes

    def _round(self, episodes, states, rendered, active, generator, step_key, round_index) -> None:
        rows = [episodes[i].prompt_ids + episodes[i].completion_ids for i in active]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, row in zip(active, rows):
            groups.setdefault(tuple(row), []).append(i)
        seed = unit_seed(self.seed, [("rollout", str(step_key), round_index)])
        t0 = time.perf_counter()
        samples: dict[int, Completion] = {}
        by_size: dict[int, list[tuple[int, ...]]] = {}
        for key, members in groups.items():
            by_size.setdefault(len(members), []).append(key)
        constraint_of: dict[int, Any] = {}
        for n, keys in by_size.items():  # identical rows (a group's first prompt) share one prompt
            constraints = [step_constraint(episodes[groups[k][0]].task, round_index, self.cfg, self.lead) for k in keys]
            outs = generator.generate([list(k) for k in keys], n, constraints=constraints, stop=self.stop,
                                      max_new_tokens=self.cfg.max_new_tokens, seed=seed)
            for key, completions, constraint in zip(keys, outs, constraints):
                samples.update(zip(groups[key], completions))
                constraint_of.update(dict.fromkeys(groups[key], constraint))
        elapsed = time.perf_counter() - t0
        self.stats.generation_s += elapsed
        t0 = time.perf_counter()
        for i in active:
            episodes[i].seconds["generation"] += elapsed / len(active)

        def one(i: int) -> None:
            self._step(episodes[i], states[i], rendered, i, samples[i], round_index, constraint_of.get(i))

        if self.workers > 1 and len(active) > 1:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(active))) as pool:
                list(pool.map(one, active))
        else:
            for i in active:
                one(i)
        elapsed = time.perf_counter() - t0
        self.stats.execution_s += elapsed
        for i in active:
            episodes[i].seconds["execution"] += elapsed / len(active)

    def _step(self, ep: Episode, state, rendered: list[str], index: int, completion: Completion,
              round_index: int, constraint=None) -> None:
        """Read, run and record one sampled step (:func:`codetool.search.step.run_step`, as the
        search does); grow the row when the episode goes on."""
        cfg, task = self.cfg, ep.task
        ids = list(completion.token_ids or [])
        text = reply_text(completion.text, self.lead, cfg)
        taken = run_step(state, text, task, cfg, prompt_tokens=completion.prompt_tokens,
                         completion_tokens=completion.completion_tokens, fork=False)
        cand, observation, result = taken.candidate, taken.observation, taken.result
        history = ep.history
        step = EpisodeStep(cand, observation, history=history, constraint=constraint)
        ep.steps.append(step)
        with self._lock:
            self.stats.steps += 1
            self.stats.generated_tokens += len(ids)
        if result.outcome == "host_error" or not_executed(result):
            # the machine's failure (the executor raised: no step's code makes it, docs/EXECUTOR.md):
            # the episode is dropped from its group, as the search leaves such an episode out
            ep.finish_type, ep.error = "error", f"not executed: {result.error_message or 'nothing ran'}"
        elif step.ended == "finish":
            ep.finish_type, ep.final_answer = "finish", str(result.final_answer)
        elif step.ended == "give_up":
            ep.finish_type = "give_up"
        going_on = ep.finish_type == "max_steps" and round_index + 1 < cfg.max_steps
        if going_on and ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]  # the template closes the turn itself
        start = len(ep.completion_ids)
        ep.completion_ids += ids
        ep.env_mask += [1] * len(ids)
        step.span = (start, start + len(ids))
        if not going_on:
            return
        env_ids, step.exact = self._environment(ep, rendered[index], ids)
        with self._lock:
            self.stats.inexact_steps += not step.exact
        ep.completion_ids += env_ids
        ep.env_mask += [0] * len(env_ids)
        rendered[index] = self.render(self.messages(task, ep.history))
        if len(ep.prompt_ids) + len(ep.completion_ids) + cfg.max_new_tokens > self.max_positions:
            logger.info("episode on %s reached the policy's context; it ends here", task.query_id)
            ep.capped = True

    def _environment(self, ep: Episode, before: str, ids: list[int]) -> tuple[list[int], bool]:
        """Ids of what the search's next prompt adds after the sampled ``ids``, and whether the row
        text then equals that prompt exactly (see the module docstring)."""
        task, history = ep.task, ep.history
        reply = self.render(self.messages(task, history, reply_only=True))
        after = self.render(self.messages(task, history))
        if not (reply.startswith(before) and after.startswith(reply)):
            raise CodetoolError("the policy's chat template does not render an episode as one growing text (a "
                                "step's prompt is not a prefix of the next one); rollouts need a template such "
                                "as ChatML, Llama or Qwen.")
        want = reply[len(before):]
        got = self.tokenizer.decode(ids, skip_special_tokens=False)
        exact = want.startswith(got)
        if exact:
            bridge = want[len(got):]
        else:  # the sampled text ran past what the search keeps: close the block as the search does
            bridge = "\n```" if self.prefixed and "```" not in got else ""
        tail = after[len(reply):]
        masked = [dict(h) for h in history]
        masked[-1]["observation"] = _SENTINEL
        shaped = self.render(self.messages(task, masked))[len(reply):]
        pre, sep, post = shaped.partition(_SENTINEL)
        shown = tail[len(pre):len(tail) - len(post)] if sep else ""
        if sep and tail.startswith(pre) and tail.endswith(post) and pre + shown + post == tail:
            ids_env = self.encode(pre) + self.encode(shown, untrusted=True) + self.encode(post)
        else:  # the template moved the observation around: no safe split
            logger.warning("could not locate the observation in the next prompt; tokenising it whole")
            ids_env = self.encode(tail)
        return self.encode(bridge, untrusted=True) + ids_env, exact

    def _fail(self, ep: Episode, error: BaseException) -> None:
        ep.finish_type, ep.error = "error", redact(f"{type(error).__name__}: {error}")[:2000]
        logger.warning("episode on %s ended with an error: %s", ep.task.query_id, ep.error[:300])


def make_rollout_func(runner: EpisodeRunner, tasks: dict[str, Any], generator_for, *, on_episodes=None):
    """TRL's ``rollout_func(prompts, trainer)``: the dataset's ``prompt`` column holds task keys.

    Args:
        runner (`EpisodeRunner`): runs the episodes.
        tasks (`dict[str, SearchTask]`): task key -> task.
        generator_for (`Callable[[GRPOTrainer], StepGenerator]`): the step generator with the
            trainer's current weights.
        on_episodes (`Callable[[list[Episode]], None]`, *optional*): sees every batch (token budget).
    Returns:
        A callable returning ``prompt_ids``, ``completion_ids``, ``logprobs`` (``None``: TRL computes
        them), ``env_mask`` and ``episode`` (one :class:`Episode` per row, for the rewards).
    Raises:
        CodetoolError: a prompt that names no known task.
    """

    def rollout(prompts: list, trainer) -> dict[str, Any]:
        missing = [p for p in prompts if p not in tasks]
        if missing:
            raise CodetoolError(f"rollout: prompt {missing[0]!r:.80} names no training task; the dataset's prompt "
                                "column must hold task keys (codetool.policy.data).")
        episodes = runner.run([tasks[p] for p in prompts], generator_for(trainer), step_key=trainer.state.global_step)
        if on_episodes is not None:
            on_episodes(episodes)
        return {"prompt_ids": [e.prompt_ids for e in episodes],
                "completion_ids": [e.completion_ids or [_pad(trainer)] for e in episodes],
                "logprobs": None,
                "env_mask": [e.env_mask or [0] for e in episodes],
                "episode": episodes}

    return rollout


def _pad(trainer) -> int:
    tok = trainer.processing_class
    return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)


class VLLMGenerator:
    """Steps from TRL's vLLM generation (``use_vllm``, colocated or a server) on GPUs.

    The sampling settings are GRPO's (``temperature``, ``top_p``, ``max_completion_length`` =
    ``rollout.max_new_tokens``); stop strings come from ``generation_kwargs`` (the GPU recipe sets
    ``stop: ["```"]``). Constraints are not applied (a 7B policy needs none). Every process must
    call :meth:`generate` as often as the others (vLLM's calls are collective), so rollouts on
    several processes run all ``max_steps`` rounds (an empty round sends its first prompt again
    and drops the result). Not run in CI (no GPU there).
    """

    def __init__(self, trainer, stop: list[str] | None):
        self.trainer, self.stop = trainer, stop

    def begin(self, model=None) -> None:
        """Nothing to reset: TRL syncs the weights into vLLM before each rollout."""

    def generate(self, rows, n, *, constraints, stop, max_new_tokens, seed):
        tok = self.trainer.processing_class
        prompts = [row for row in rows for _ in range(n)]
        _, completion_ids, _, _ = self.trainer.vllm_generation.generate(prompts=prompts, images=None,
                                                                         num_generations=n)
        out = []
        for r in range(len(rows)):
            row = []
            for ids in completion_ids[r * n:(r + 1) * n]:
                text = tok.decode(ids, skip_special_tokens=True)
                at = find_stop(text, stop)
                row.append(Completion(text if at < 0 else text[:at], len(rows[r]), len(ids),
                                      "stop" if at >= 0 else "length", list(ids)))
            out.append(row)
        return out
