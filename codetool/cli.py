"""The ``codetool`` command line: ``codetool <command> [--config YAML] [--key value ...]``.

Each command is one config dataclass plus one function, listed in ``COMMANDS`` below (the only
place that knows them). Modules are imported only when their command runs, so ``codetool --help``
is instant. Errors meant for users (:class:`codetool.CodetoolError`) and file-system refusals
(``OSError``: a folder given for a file, a full disk) print one line and exit 2; anything else is a
bug and prints a traceback. ``--debug`` shows tracebacks for all of them.

``codetool <command> --help`` builds the command's parser from its config class, which imports no
heavy library, except where a config extends TRL's (``train-prm``: ``SFTConfig``, which imports
transformers and torch): there :data:`LIGHT_HELP` names a class of the config's own options that
imports neither, and the help points at ``--help-all``, which builds the full parser (seconds).
Nothing is cached: ``--help`` reads and writes no file.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import logging
import os
import signal
import sys
import threading
import time

from codetool import CodetoolError, __version__
from codetool.config import ConfigError, _flat_fields, did_you_mean, load_yaml, renamed_error, section_class
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

# command -> the class of its config's own options ("module:Class"), for --help without TRL, and
# the library config the full config extends (tests/test_cli.py checks the class against the config).
LIGHT_HELP: dict[str, str] = {"train-prm": "codetool.prm.options:PRMOptions"}
LIBRARY_CONFIG = {"train-prm": "TRL's SFTConfig / transformers' TrainingArguments"}

logger = logging.getLogger("codetool")


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


def _help_parser(name: str) -> argparse.ArgumentParser:
    """The parser ``codetool <name> --help`` prints: the command's, or for a command in
    :data:`LIGHT_HELP` its own options and a line for the library's, built without importing it."""
    if name not in LIGHT_HELP:
        return _command_parser(name, _load(name)[0])
    parser = _command_parser(name, section_class(LIGHT_HELP[name]))
    parser.add_argument("--help-all", action="store_true", dest="cli_help_all",
                        help=f"also list every option of {LIBRARY_CONFIG[name]}, which this command takes too "
                             "(--KEY VALUE, e.g. --optim adafactor); imports them (seconds)")
    return parser


def _command_parser(name: str, config_cls: type) -> argparse.ArgumentParser:
    """The parser of ``codetool <name>``: the CLI's own options, then one per field of ``config_cls``."""
    parser = argparse.ArgumentParser(prog=f"codetool {name}", description=COMMANDS[name][3], allow_abbrev=False)
    # dests that no config field has (TRL's SFTConfig has log_level and debug fields)
    parser.add_argument("--debug", action="store_true", dest="cli_debug", help="show tracebacks and debug logs")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
                        dest="cli_log_level", help="log level of codetool's messages, any case [default: INFO]")
    add_arguments(parser, config_cls)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, Slurm's time limit) raised in the main thread: it unwinds like Ctrl-C, so
    output locks are released, logs closed and finished work kept (issue 40)."""


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``codetool`` console script; returns the exit status (143 after SIGTERM,
    130 after Ctrl-C: the work finished so far is kept and a rerun resumes)."""
    handled = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL, None)
    if handled:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(argv)
    finally:
        if handled:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("WANDB_MODE", "disabled")  # tracking is opt-in (report_to: wandb)
    # torch's OpenMP threads sleep instead of spinning while they wait (read when torch is first
    # imported, which no command has done yet): on a shared CPU a spinning thread burns its core
    # while its partner waits to be scheduled, and every small matmul of a decoding step waits so
    # (docs/TESTBED.md 5.1: 3-4x the CPU time per step at load 5-9). The numbers do not change.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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
    if "-h" in rest or "--help" in rest:
        _help_parser(name).parse_args(["--help"])  # prints the help and exits 0
        return 0
    try:
        config_cls, func = _load(name)
        parser = _command_parser(name, config_cls)
        if "--help-all" in rest:
            parser.parse_args(["--help"])
            return 0
        args, unknown = parser.parse_known_intermixed_args(rest)
        sections, unknown = _section_options(config_cls, unknown)
        if unknown:
            valid = ["config"] + [n for n, _, _ in _flat_fields(config_cls)]
            bad = unknown[0]
            key = bad.lstrip("-").split("=")[0].replace("-", "_")
            renamed = renamed_error(config_cls, key, flag=True)
            if renamed is not None:
                raise renamed
            raise ConfigError(f"unknown option '{bad}' for 'codetool {name}'." + did_you_mean(key, valid, spell="--{}")
                              + f" Run 'codetool {name} --help' for the options.")
        _configure_logging("DEBUG" if debug else args.cli_log_level)
        try:
            cfg = config_from_args(config_cls, args, sections)
        except ConfigError:
            recipe_hint = _pipeline_recipe(name, config_cls, getattr(args, "config", None))
            if recipe_hint:
                raise ConfigError(recipe_hint) from None
            raise
        start = time.time()
        status = func(cfg)
        logger.debug("%s finished in %.1f s", name, time.time() - start)
        return int(status or 0)
    except CodetoolError as e:
        if debug:
            raise
        print(f"codetool {name}: error: {' '.join(str(e).split())}", file=sys.stderr)  # one line, always
        return 2
    except OSError as e:  # the file system said no (a folder given for a file, a full disk, permissions)
        if debug:
            raise
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"codetool {name}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        after = "stopped." if name.startswith("serve-") else "finished work is saved and a rerun resumes."
        print(f"codetool {name}: {how}; {after}", file=sys.stderr)  # a server has nothing to resume
        return 143 if isinstance(e, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())
