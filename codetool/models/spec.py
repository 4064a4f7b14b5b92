"""One parser for model specs: what a ``--policy``, ``--model``, ``judge.model`` or ``--prm`` value means.

A spec string is parsed once into a :class:`ModelSpec` (its kind, where the model is, and the
options that kind takes); every place that builds a policy, a judge or a PRM scorer asks the
spec instead of testing the string's prefix again (issue 18). The forms:

| spec | kind (policy, judge) | kind (PRM) | options used |
|---|---|---|---|
| ``http://...``, ``https://...`` (several: comma-separated) | ``openai`` (OpenAI-compatible server) | ``server`` (``codetool serve-prm``) | ``remote_model``, ``api_key_env``, ``client`` |
| ``vllm:<model>`` | ``vllm`` (in-process, GPU) | ``vllm`` | ``dtype`` |
| ``default``, a folder, a ``.gguf``, a Hub id | ``local`` (transformers) | ``local`` (a train-prm folder) | ``dtype``, ``device``, ``max_batch_size`` |
| ``none`` / empty | (error) | ``none`` | |
| ``rollout`` | (a local model of that name) | ``rollout`` (Monte Carlo rollouts with the policy) | |

Settings that cannot apply to the kind are an error, not silently dropped: a ``remote_model``
with a local or ``vllm:`` model raises :class:`~codetool.config.ConfigError`. Several server
URLs, comma-separated, are endpoints of the same model (``codetool.models.remote``).

:class:`PolicyGroup` (and :class:`PolicyBackendGroup`) are the policy settings that ``run``,
``build-trees`` and ``pipeline`` compose: they parse ``policy`` once, in ``__post_init__``, into
``policy_spec``, which everything below the config takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.config_groups import Group
from codetool.models.remote import RemoteConfig, split_urls

POLICY_KINDS = ("local", "openai", "vllm")
PRM_KINDS = ("none", "rollout", "server", "vllm", "local")
ROLES = ("policy", "judge", "prm")
# The settings group of each role's remote client (named in error messages).
CLIENT_SETTINGS = {"policy": "policy_client", "judge": "judge.client", "prm": "prm_client"}


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec.

    Args:
        text (`str`): the spec as given (stripped), e.g. ``"default"`` or ``"http://127.0.0.1:8001/v1"``.
        kind (`str`): one of :data:`POLICY_KINDS` (policies, judges) or :data:`PRM_KINDS` (PRMs).
        location (`str`): the model without its scheme: a folder, Hub id, base URL or vLLM model.
        role (`str`): ``policy``, ``judge`` or ``prm`` (names the setting in error messages).
        remote_model, api_key_env, dtype, device, max_batch_size: the options of the kind (see
            :meth:`backend_kwargs`); ``None`` leaves the backend's default.
        client (`RemoteConfig`, *optional*): the limits of a server's client (``policy_client``,
            ``prm_client``, ``judge.client``); ``None``: the defaults.
    """

    text: str
    kind: str
    location: str
    role: str = "policy"
    remote_model: str | None = None
    api_key_env: str | None = None
    dtype: str | None = None
    device: str | None = None
    max_batch_size: int | None = None
    client: RemoteConfig | None = None

    @classmethod
    def parse(cls, spec: str | None, *, role: str = "policy", remote_model: str | None = None,
              api_key_env: str | None = None, dtype: str | None = None, device: str | None = None,
              max_batch_size: int | None = None, client: RemoteConfig | None = None) -> ModelSpec:
        """Parse ``spec`` for ``role`` with the options given alongside it.

        Raises:
            CodetoolError: an empty policy or judge spec.
            ConfigError: ``remote_model`` with a spec that is not an http(s) URL.
        """
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        text = str(spec or "").strip()
        if text.startswith(("http://", "https://")):
            kind, location = ("server" if role == "prm" else "openai"), text
            bad = [u for u in split_urls(text) if not u.startswith(("http://", "https://"))]
            if bad:
                raise ConfigError(f"the {role} {text!r} lists endpoints that are not http(s) URLs ({', '.join(bad)}); "
                                  "give several endpoints as comma-separated http(s):// URLs.")
        elif text.startswith("vllm:"):
            kind, location = "vllm", text[len("vllm:"):] or "default"
        elif role == "prm" and text.lower() in ("", "none"):
            kind, location = "none", ""
        elif role == "prm" and text == "rollout":
            kind, location = "rollout", ""
        elif not text:
            raise CodetoolError(f"no model given for the {role}; pass 'default', a model path, a Hub id, an http(s):// "
                                "URL of an OpenAI-compatible server, or vllm:<model>.")
        else:
            kind, location = "local", text
        if remote_model and kind not in ("openai", "server"):
            raise ConfigError(f"remote_model {remote_model!r} names a model on an http(s) server, but the {role} "
                              f"{text!r} is not a server URL; drop remote_model or pass the server's http(s):// URL.")
        return cls(text=text, kind=kind, location=location, role=role, remote_model=remote_model or None,
                   api_key_env=api_key_env, dtype=dtype, device=device, max_batch_size=max_batch_size,
                   client=client)

    @classmethod
    def folder(cls, path, *, role: str = "policy", **options) -> ModelSpec:
        """The spec of a local model folder this program wrote or found (a trained checkpoint): no
        text to parse. ``options`` are the fields of a local kind (``dtype``, ``device``, ...)."""
        return cls(text=str(path), kind="local", location=str(path), role=role, **options)

    def at(self, path) -> ModelSpec:
        """This spec's options for the local model folder ``path`` (a checkpoint trained from it)."""
        return ModelSpec.folder(path, role=self.role, dtype=self.dtype, device=self.device,
                                max_batch_size=self.max_batch_size)

    @property
    def remote(self) -> bool:
        """Whether the model answers over HTTP (an OpenAI-compatible or ``serve-prm`` server)."""
        return self.kind in ("openai", "server")

    @property
    def latent(self) -> str:
        """The search's ``latent`` source this PRM spec implies: ``none``, ``rollout`` or ``prm``."""
        return self.kind if self.kind in ("none", "rollout") else "prm"

    def backend_kwargs(self) -> dict:
        """Keyword options of the backend of this kind (``make_backend``): servers take
        ``model``/``api_key_env``/``client`` (and, for policies and judges, the ``setting`` and
        ``role`` their errors name), ``vllm:`` takes ``dtype``, local models ``dtype``/``device``/
        ``max_batch_size``; options left ``None`` are not passed."""
        if self.remote:
            options = {"model": self.remote_model, "api_key_env": self.api_key_env, "client": self.client}
            if self.kind == "openai":
                options.update(setting=CLIENT_SETTINGS[self.role], role=self.role)
            return {k: v for k, v in options.items() if v is not None or k == "model"}
        names = ("dtype",) if self.kind == "vllm" else ("dtype", "device", "max_batch_size")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}


@dataclass
class PolicyGroup(Group):
    """The policy: which model, the name a server knows it by, how many sequences a local one decodes
    together, and a server's client limits (composed by ``run``, ``build-trees`` and ``pipeline``).

    ``__post_init__`` parses ``policy`` once into ``policy_spec`` (a :class:`ModelSpec`; an attribute,
    not a setting: not in ``to_dict``, the config hashes or the flags); the code below the config
    takes that spec. A command whose config has no ``policy_dtype``/``api_key_env`` setting gets the
    backends' defaults below (:class:`PolicyBackendGroup` makes them settings).

    Raises:
        ConfigError: a ``remote_model`` with a policy that is not a server URL.
    """

    policy_dtype = "auto"  # not settings here: PolicyBackendGroup declares them as fields
    api_key_env = "OPENAI_API_KEY"

    policy: str = option("default", "policy: default, a model path, Hub id, http(s) URL of an OpenAI-compatible server "
                         "(several endpoints of one model: comma-separated), or vllm:<model>")
    policy_max_batch_size: int = option(16, "sequences decoded together (local policy)")
    remote_model: str | None = option(None, "model name sent to an http(s) policy server")
    policy_client: RemoteConfig = field(default_factory=RemoteConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.policy_spec = ModelSpec.parse(self.policy, role="policy", remote_model=self.remote_model,
                                           api_key_env=self.api_key_env, dtype=self.policy_dtype,
                                           max_batch_size=self.policy_max_batch_size, client=self.policy_client)


@dataclass
class PolicyBackendGroup(PolicyGroup):
    """:class:`PolicyGroup` with the options of how its backend is opened as settings: the dtype of
    a local model and the variable that holds a server's key (``codetool run``)."""

    policy_dtype: str = option("auto", "policy dtype (local models)", choices=["auto", "float32", "bfloat16", "float16"])
    api_key_env: str = option("OPENAI_API_KEY", "environment variable with the policy server's key")
