"""``codetool data fetch DATASET... [--from-dir DIR] [--out data]``: get the public benchmark files.

:func:`codetool.tools.data.fetch` copies them from a local folder laid out like ``../shared/data``
(``--from-dir``) or downloads them; this command prints what it got and what is missing, and
exits 1 when any file is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codetool.config import ConfigError, option
from codetool.tools.data import DATASETS, fetch


@dataclass
class DataConfig:
    """Options of ``codetool data``."""

    action: str = option("fetch", "what to do", choices=("fetch",), positional=True)
    datasets: list[str] = option(default_factory=lambda: list(DATASETS),
                                 help="datasets to fetch (default: all of " + ", ".join(DATASETS) + "; the "
                                      "benchmark runs need codetool's query subsets and TMDB spec too)",
                                 positional=True)
    from_dir: str | None = option(None, "copy from this local folder (same layout, e.g. ../shared/data) "
                                        "instead of downloading", aliases=("--from",))
    out: str = option("data", "folder to write the files into")
    timeout_s: float = option(60.0, "download timeout per file, in seconds")

    def __post_init__(self):
        unknown = [d for d in self.datasets if d not in DATASETS]
        if unknown:
            raise ConfigError(f"unknown dataset(s) {unknown}; choose from {list(DATASETS)}.")
        if self.from_dir is not None and not Path(self.from_dir).is_dir():
            raise ConfigError(f"--from {self.from_dir}: the folder does not exist. Pass a folder laid out like "
                              f"../shared/data (e.g. RestGPT/specs/tmdb_oas.json inside it).")


def data_command(cfg: DataConfig) -> int:
    """``codetool data fetch DATASET... [--from-dir DIR] [--out data]``; exit status 1 if any file is missing."""
    from rich.console import Console

    source = Path(cfg.from_dir) if cfg.from_dir else None
    report = fetch(cfg.datasets, Path(cfg.out), source, cfg.timeout_s)
    console = Console()
    for name, r in report.items():
        status = "[green]complete[/green]" if not r["missing"] else "[red]incomplete[/red]"
        console.print(f"{name}: {len(r['got'])} files in {cfg.out}/, {len(r['missing'])} missing ({status})")
        for rel in r["missing"]:
            console.print(f"  missing: {rel}")
    return 1 if any(r["missing"] for r in report.values()) else 0
