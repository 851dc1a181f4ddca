"""capsim figures: the notebooks' what-if figures and their data (sim.figures)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.io.errors import ConfigError
from sim.io.units import fmt_bytes, parse_bytes


def _add_figures(sub) -> argparse.ArgumentParser:
    from sim.figures import FIGURES
    p = sub.add_parser("figures", help="write every what-if figure (PNG) and its data (CSV), as the notebooks draw them")
    p.add_argument("--out", required=True, help="NAME.png and NAME[-part].csv go here (all or nothing)")
    p.add_argument("--force", action="store_true", help="overwrite files already in --out")
    p.add_argument("--only", nargs="+", action="extend", choices=list(FIGURES), metavar="NAME",
                   help="only these figures (repeatable): " + ", ".join(FIGURES))
    p.add_argument("--data-dir", help="public data folder holding traces/mooncake_fast25 (default: "
                                      "$CAPSIM_SHARED_DATA, else ../shared/data next to the repository); figures "
                                      "that need it are skipped when it is absent")
    return p


def cmd_figures(args) -> int:
    """`capsim figures`: write every what-if figure and its data."""
    from sim.figures import write_figures
    from sim.io.outputs import staged_output
    with staged_output(args.out, args.force) as stage:
        try:
            files, skipped = write_figures(stage, args.only, args.data_dir,
                                           log=lambda line: print(line.replace(str(stage), str(args.out)),
                                                                  file=sys.stderr, flush=True))
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
    pngs = [f for f in files if f.suffix == ".png"]
    print(f"wrote {len(pngs)} figure(s) and {len(files) - len(pngs)} data file(s) to {args.out}"
          + (f"; skipped {', '.join(skipped)} (data absent)" if skipped else ""))
    return 0


def add_parsers(sub) -> None:
    """Register this module's commands on the `capsim` subparsers."""
    _add_figures(sub).set_defaults(func=cmd_figures)
