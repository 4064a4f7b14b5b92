"""The ``codetool`` command line: ``codetool <command> [--config YAML] [--key value ...]``.

Each command is one config dataclass plus one function, listed in ``COMMANDS`` below (the only
place that knows them). Modules are imported only when their command runs, so ``codetool --help``
is instant. Errors meant for users (:class:`codetool.CodetoolError`) and file-system refusals
(``OSError``: a folder given for a file, a full disk) print one line and exit 2; anything else is a
bug and prints a traceback. ``--debug`` shows tracebacks for all of them.

``codetool <command> --help`` needs the command's config class, and ``train-prm``'s and
``train-policy``'s extend TRL's (``SFTConfig``, ``GRPOConfig``: importing them imports transformers
and torch, 6-15 s). So a parser that took over a second to build keeps its options (flags, help,
defaults, choices) as JSON in the cache folder (``$CODETOOL_CACHE_DIR``, else
``$XDG_CACHE_HOME/codetool`` or ``~/.cache/codetool``) under a name that changes with codetool's
sources, Python and the TRL stack's versions, and the next ``--help`` rebuilds the parser from it
without importing the command (< 0.5 s; ``make setup`` builds both once). Limit: a default that an
environment variable sets when the class is imported would show its value from the first build.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import importlib
import json
import logging
import os
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from codetool import CodetoolError, __version__
from codetool.config import ConfigError, _flat_fields, load_yaml
from codetool.config_args import add_arguments, config_from_args
from codetool.secrets import RedactingFilter

# command -> (module, config class, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "setup": ("codetool.commands.setup", "SetupConfig", "setup",
              "install and cache the embedded default model (idempotent)"),
    "generate": ("codetool.commands.generate", "GenerateConfig", "generate_command",
                 "generate a completion with any model (smoke test of a backend)"),
    "data": ("codetool.commands.data", "DataConfig", "data_command",
             "fetch benchmark files into data/ (download, or copy with --from DIR)"),
    "serve-mock": ("codetool.commands.serve_mock", "ServeMockConfig", "serve_mock",
                   "serve a mock API on loopback: any OpenAPI spec (every method it declares), TMDB, or StableToolBench's /virtual"),
    "run": ("codetool.commands.run", "RunConfig", "run_command",
            "run the stepwise code search on one query, your query file (+ OpenAPI spec) or a benchmark"),
    "build-trees": ("codetool.commands.build_trees", "TreeConfig", "build_trees_command",
                    "build DFS action trees of a query file (ToolBench, or RestGPT's layout + --tools spec) and export the PRM dataset"),
    "train-prm": ("codetool.commands.train_prm", "PRMConfig", "train_command",
                  "train the process reward model (TRL SFTTrainer; works under accelerate launch)"),
    "eval-prm": ("codetool.commands.eval_prm", "EvalPRMConfig", "eval_prm_command",
                 "pairwise accuracy, AUC and calibration of a PRM on held-out pairs"),
    "score": ("codetool.commands.score", "ScoreConfig", "score_command",
              "score PRM examples from a JSONL file"),
    "serve-prm": ("codetool.commands.serve_prm", "ServePRMConfig", "serve_prm",
                  "serve a PRM over HTTP: POST /score, GET /health, the schema at /docs (docs/SERVING.md)"),
    "eval": ("codetool.commands.eval", "EvalConfig", "eval_command",
             "evaluate trajectory files: SoPR, SoWR, path rate, SCEP, cost; writes a report"),
    "eval-decision": ("codetool.commands.eval_decision", "DecisionEvalConfig", "eval_decision_command",
                      "benchmark the decide-first stage (When2Tool metrics)"),
    "train-probe": ("codetool.commands.train_probe", "TrainProbeConfig", "train_probe_command",
                    "label queries by a run without tools and train the hidden-state probe (When2Tool)"),
    "pipeline": ("codetool.commands.pipeline", "PipelineConfig", "pipeline_command",
                 "trees -> PRM -> guided search -> evaluation, resumable by stage"),
    "train-policy": ("codetool.commands.train_policy", "TrainPolicyConfig", "train_policy_command",
                     "GRPO of the policy on code-tool episodes with on-the-spot, PRM and outcome rewards"),
}

logger = logging.getLogger("codetool")

HELP_CACHE_MIN_S = 1.0  # a --help that took longer than this to build is kept (see the docstring)
HELP_DEPENDENCIES = ("transformers", "trl", "peft", "accelerate")  # whose classes the configs extend


def _configure_logging(level: str) -> None:
    from rich.logging import RichHandler

    handler = RichHandler(show_path=False, rich_tracebacks=False, log_time_format="%H:%M:%S")
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("codetool").setLevel(level)
    # Third-party chatter stays at warnings unless --debug.
    for noisy in ("httpx", "urllib3", "datasets", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "DEBUG" else logging.INFO)


def _load(name: str):
    module_name, config_name, func_name, _ = COMMANDS[name]
    module = importlib.import_module(module_name)
    return getattr(module, config_name), getattr(module, func_name)


def _help_cache_file(name: str) -> Path:
    """Where ``codetool <name>``'s options are kept for ``--help``; the file name is a hash of what
    they depend on (codetool's sources, Python, ``HELP_DEPENDENCIES``' versions), so after any
    change they are built afresh. Hashing the sources takes ~20 ms."""
    root = os.environ.get("CODETOOL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "codetool")
    digest = hashlib.sha256(sys.version.encode())
    for dist in HELP_DEPENDENCIES:
        try:
            digest.update(f"|{dist}={version(dist)}".encode())
        except PackageNotFoundError:
            digest.update(f"|{dist}=none".encode())
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return Path(root) / "help" / f"{name}-{digest.hexdigest()[:24]}.json"


def _parser_options(parser: argparse.ArgumentParser) -> list[dict]:
    """Every option of ``parser`` but ``--help``, as JSON-ready dicts (:func:`_parser_from_options`)."""
    return [{"flags": a.option_strings, "dest": a.dest, "switch": isinstance(a, argparse._StoreTrueAction),
             "nargs": a.nargs, "const": a.const, "default": a.default, "metavar": a.metavar, "help": a.help,
             "choices": list(a.choices) if a.choices is not None else None}
            for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def _parser_from_options(name: str, options: list[dict]) -> argparse.ArgumentParser:
    """The parser of ``codetool <name>`` rebuilt from :func:`_parser_options`' list (for ``--help``)."""
    parser = argparse.ArgumentParser(prog=f"codetool {name}", description=COMMANDS[name][3], allow_abbrev=False)
    for o in options:
        # argparse tells SUPPRESS by identity, which a JSON round trip loses
        o = {k: argparse.SUPPRESS if v == argparse.SUPPRESS else v for k, v in o.items()}
        if o["switch"]:
            parser.add_argument(*o["flags"], dest=o["dest"], action="store_true", help=o["help"])
            continue
        kwargs = {k: o[k] for k in ("nargs", "const", "default", "metavar", "help", "choices") if o[k] is not None}
        if o["flags"]:
            parser.add_argument(*o["flags"], dest=o["dest"], **kwargs)
        else:
            parser.add_argument(o["dest"], **kwargs)
    return parser


def _keep_options(path: Path, parser: argparse.ArgumentParser) -> None:
    """Write ``parser``'s options to ``path`` atomically; a cache folder that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(_parser_options(parser)), encoding="utf-8")
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError) as e:  # TypeError: a default JSON cannot hold
        logger.debug("options of --help not cached in %s: %s", path.parent, e)


def _section_options(config_cls: type, argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The ``--<section>.<key> VALUE`` (``=VALUE``; alone: ``true``) options of ``argv`` for the
    section fields of ``config_cls`` (``codetool.config.section``: the pipeline's ``train``), as
    ``{dotted key: text}``, and the arguments left; the section's config checks them when built."""
    prefixes = tuple(f"--{name}." for name, f, _ in _flat_fields(config_cls) if "section" in f.metadata)
    found: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        if not prefixes or not argv[i].startswith(prefixes):
            rest.append(argv[i])
            i += 1
            continue
        key, eq, value = argv[i][2:].partition("=")
        if not eq:
            takes = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            value = argv[i + 1] if takes else "true"
            i += takes
        found[key] = value
        i += 1
    return found, rest


def _top_parser() -> argparse.ArgumentParser:
    lines = "\n".join(f"  {name:<14} {entry[3]}" for name, entry in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="codetool",
        description="Process reward models for code-writing tool agents (CodeTool, ACL 2025).",
        epilog=f"commands:\n{lines}\n\nRun 'codetool <command> --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"codetool {__version__}")
    parser.add_argument("command", nargs="?", help="one of the commands below")
    return parser


def _pipeline_recipe(name: str, config_cls: type, path: str | None) -> str | None:
    """What to say when ``codetool <name> --config PATH`` was handed a pipeline recipe (its
    top-level keys are ``PipelineConfig``'s and some are no key of ``config_cls``), else ``None``."""
    if name == "pipeline" or not path:
        return None
    try:
        data = load_yaml(path)
    except (CodetoolError, OSError):
        return None
    pipeline_cls, _ = _load("pipeline")
    pipeline_keys = {f.name for f in dataclasses.fields(pipeline_cls)}
    own = {f.name for f in dataclasses.fields(config_cls)}
    if not isinstance(data, dict) or not set(data) <= pipeline_keys or not set(data) - own:
        return None
    return (f"{path} is a pipeline recipe (top-level keys {', '.join(sorted(set(data) - own))} are the pipeline's "
            f"stages and settings, not 'codetool {name}' keys): use `codetool pipeline --config {path}`, or give "
            f"'codetool {name}' a recipe of its own (see 'codetool {name} --help').")


def _command_parser(name: str, config_cls: type) -> argparse.ArgumentParser:
    """The parser of ``codetool <name>``: the CLI's own options, then one per field of ``config_cls``."""
    parser = argparse.ArgumentParser(prog=f"codetool {name}", description=COMMANDS[name][3], allow_abbrev=False)
    # dests that no config field has (TRL's SFTConfig has log_level and debug fields)
    parser.add_argument("--debug", action="store_true", dest="cli_debug", help="show tracebacks and debug logs")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
                        dest="cli_log_level", help="log level of codetool's messages, any case [default: INFO]")
    add_arguments(parser, config_cls)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``codetool`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("WANDB_MODE", "disabled")  # tracking is opt-in (report_to: wandb)
    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help", "--version"):
        top.parse_args(argv or ["--help"])
        return 0
    name = argv[0]
    if name not in COMMANDS:
        hint = difflib.get_close_matches(name, COMMANDS, n=1)
        print(f"codetool: unknown command '{name}'." + (f" Did you mean '{hint[0]}'?" if hint else "")
              + " Run 'codetool --help' for the list.", file=sys.stderr)
        return 2
    debug = "--debug" in argv
    rest = [a for a in argv[1:] if a != "--debug"]
    wants_help = "-h" in rest or "--help" in rest
    help_file = _help_cache_file(name) if wants_help else None
    if help_file is not None and help_file.is_file():
        try:
            cached = _parser_from_options(name, json.loads(help_file.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as e:  # unreadable: built afresh below
            logger.debug("cached options in %s not used: %s", help_file, e)
        else:
            cached.print_help()
            return 0
    try:
        built = time.perf_counter()
        config_cls, func = _load(name)
        parser = _command_parser(name, config_cls)
        if help_file is not None and time.perf_counter() - built > HELP_CACHE_MIN_S:
            _keep_options(help_file, parser)
        args, unknown = parser.parse_known_intermixed_args(rest)
        sections, unknown = _section_options(config_cls, unknown)
        if unknown:
            valid = ["config"] + [n for n, _, _ in _flat_fields(config_cls)]
            bad = unknown[0]
            key = bad.lstrip("-").split("=")[0].replace("-", "_")
            hint = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            raise ConfigError(f"unknown option '{bad}' for 'codetool {name}'."
                              + (f" Did you mean '--{hint[0]}'?" if hint else "")
                              + f" Run 'codetool {name} --help' for the options.")
        _configure_logging("DEBUG" if debug else args.cli_log_level)
        try:
            cfg = config_from_args(config_cls, args, sections)
        except ConfigError:
            hint = _pipeline_recipe(name, config_cls, getattr(args, "config", None))
            if hint:
                raise ConfigError(hint) from None
            raise
        start = time.time()
        status = func(cfg)
        logger.debug("%s finished in %.1f s", name, time.time() - start)
        return int(status or 0)
    except CodetoolError as e:
        if debug:
            raise
        print(f"codetool {name}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the file system said no (a folder given for a file, a full disk, permissions)
        if debug:
            raise
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"codetool {name}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"codetool {name}: interrupted; finished work is saved and a rerun resumes.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
