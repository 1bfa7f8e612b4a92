"""The ``mxoid`` command: look at training logs, launch distributed jobs, export models.

::

    mxoid show runs/digits/log.jsonl                          # the records, a row per epoch
    mxoid show runs/digits/log.jsonl --records 'valid_*' test_accuracy
    mxoid plot runs/digits/log.jsonl -o curves.png            # learning curves
    mxoid launch -n 2 -- python train.py                      # see mxoid.distributed.launch
    mxoid native                                              # build the fused metric operator
    mxoid average runs/nmt --best 4 --by valid_perplexity --min -o averaged   # checkpoints
    mxoid export checkpoints -o model.onnx                    # see mxoid.export.commands
    mxoid quantize checkpoints --calibration inputs.npy -o served/int8

``python -m mxoid`` is the same command. Logs are files written by
:class:`~mxoid.extensions.JSONLinesLog` or :class:`~mxoid.extensions.CSVLog`,
read with :func:`mxoid.log_files.read_log`. Bad input (a missing file, an
empty log, a file that is not a log, an unknown record) gets a one-line
error on standard error and exit status 1; bad usage gets status 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

from . import __version__
from .errors import InputError
from .export.commands import add_commands as add_export_commands
from .log.curves import SPLITS as SPLITS  # importable from here, as before
from .log.curves import epoch_positions, metric_families
from .log.files import ITERATION, RUN, continued_rows, parse_log_file
from .log.table import (
    format_table,
    is_number,
    numeric_record,
    plot_records,
    read_rows,
    select_records,
    split_names,
)

__all__ = [
    "PLOT_EXTRA",
    "InputError",
    "epoch_positions",
    "format_table",
    "main",
    "metric_families",
    "plot",
    "select_records",
    "show",
]

EXIT_BAD_INPUT = 1
PLOT_EXTRA = (
    "mxoid plot needs matplotlib, which is not installed: "
    "pip install 'mxoid[plot]' (or: pip install matplotlib)"
)
DESCRIPTION = """\
Look at the logs that JSONLinesLog and CSVLog write, launch a distributed
training job, average checkpoints, or export a trained model (ONNX, int8).
Exit status: 0 on success, 1 for bad input (missing file, empty log, not a
log, unknown record), 2 for bad usage."""


# -------------------------------------------------------------------- show
def show(args: argparse.Namespace) -> int:
    """``mxoid show``: print the table of ``args.log``; return the exit status.

    Raises
    ------
    InputError
        For a missing, empty or unreadable log, or an unknown record.
    """
    rows = read_rows(args.log, all_runs=args.all_runs)
    records = select_records(rows, split_names(args.records), args.log)
    print(format_table(rows, records, all_runs=args.all_runs))
    return 0


# -------------------------------------------------------------------- plot
def _run_title(path: str) -> str:
    """Name the run a log file holds: the file, the run number, when it started."""
    contents = parse_log_file(path)
    rows = continued_rows(contents)
    runs = sorted({row[RUN] for row in rows})
    started = contents.started.get(runs[0]) if runs else None
    text = f"{os.path.basename(path)}: run {runs[-1] if runs else 1}"
    if len(runs) > 1:
        text += f" (resumed {len(runs) - 1}x)"
    return text + (f", started {started}" if started else "")


def plot(args: argparse.Namespace) -> int:
    """``mxoid plot``: draw the learning curves of ``args.logs`` into ``args.output``.

    One panel per family of :func:`~mxoid.log.curves.metric_families`, a line per record and
    log file, against epochs (:func:`~mxoid.log.curves.epoch_positions`, integer ticks) or
    iterations. A resumed run is drawn as one run.

    Raises
    ------
    InputError
        Without matplotlib (naming the ``plot`` extra), for bad input as
        :func:`show`, for a record that holds no numbers, or when the image
        cannot be written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise InputError(PLOT_EXTRA) from None
    logs = [(path, read_rows(path)) for path in args.logs]
    wanted = split_names(args.records)
    records: List[str] = []
    for path, rows in logs:
        chosen = select_records(rows, wanted, path) if wanted else plot_records(rows)
        for name in chosen:
            if not numeric_record(rows, name):
                raise InputError(f"{path}: record {name!r} holds no numbers; it cannot be plotted")
        records += [name for name in chosen if name not in records]
    if not records:
        raise InputError(f"{args.logs[0]}: no record to plot")
    families = metric_families(records)
    overlay = len(logs) > 1
    columns = min(3, len(families))
    lines = math.ceil(len(families) / columns)
    figure = Figure(figsize=(4.8 * columns, 3.4 * lines), dpi=args.dpi, layout="constrained")
    FigureCanvasAgg(figure)
    colours: Dict[str, str] = {}  # a line's label -> its colour, the same in every panel
    for index, (family, members) in enumerate(families.items(), start=1):
        axes = figure.add_subplot(lines, columns, index)
        for path, rows in logs:
            if args.x == "epoch":
                positions = epoch_positions(rows)
            else:
                positions = [float(row[ITERATION]) for row in rows]
            for label, name in members:
                points = [
                    (x, row[name]) for x, row in zip(positions, rows) if is_number(row.get(name))
                ]
                if not points:
                    continue
                xs, ys = zip(*points)
                if overlay:
                    label = f"{os.path.splitext(os.path.basename(path))[0]}: {label}"
                colour = colours.setdefault(label, f"C{len(colours) % 10}")
                axes.plot(
                    xs,
                    ys,
                    marker="o" if len(points) <= 50 else None,
                    markersize=3,
                    label=label,
                    color=colour,
                )
        axes.set_title(family)
        axes.set_xlabel("epoch" if args.x == "epoch" else "iteration (batches done)")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(True, alpha=0.3)
        if overlay or len(members) > 1 or members[0][0] != family:
            axes.legend()
    figure.suptitle(" vs ".join(_run_title(path) for path, _ in logs))
    try:
        figure.savefig(args.output)
    except (OSError, ValueError) as error:
        raise InputError(f"cannot write {args.output}: {error}") from None
    print(f"wrote {args.output}: {len(families)} panel(s), {len(records)} record(s)")
    return 0


def native(args: argparse.Namespace) -> int:
    """Build mxoid's fused metric operator now (once per machine) and load it."""
    from .metrics import native as operator

    if not operator.build():
        raise InputError(
            f"the fused metric operator is unavailable: {operator.unavailable_reason()}"
        )
    print(f"mxoid's fused metric operator is built and loads: {operator.library_path()}")
    return 0


def average(args: argparse.Namespace) -> int:
    """Average a Checkpoint directory's best (or last) N checkpoints into MXNet's files."""
    from .checkpoint.averaging import average_checkpoints, choose_checkpoints, write_average
    from .checkpoint.format import CheckpointError

    if not os.path.isdir(args.directory):
        raise InputError(f"{args.directory}: no such directory")
    if (args.best is None) == (args.last is None) or (args.best is not None) != bool(args.by):
        raise InputError("give --best N with --by RECORD, or --last N")
    n = args.best or args.last
    if n < 1:
        raise InputError(f"N must be at least 1, got {n}")
    mode = args.mode or ("max" if args.by and _higher_is_better(args.by) else "min")
    try:
        folders = choose_checkpoints(args.directory, n, args.by, mode)
        if not folders:
            found = "with the record " + repr(args.by) if args.by else "at all"
            raise InputError(f"{args.directory} holds no checkpoint {found}")
        written = write_average(args.output, folders, average_checkpoints(folders))
    except (CheckpointError, ValueError, OSError) as error:
        raise InputError(str(error)) from None
    print(f"averaged {len(folders)} checkpoints:")
    for folder in folders:
        print(f"  {folder}")
    print("wrote " + ", ".join(written))
    return 0


def _higher_is_better(record: str) -> bool:
    return any(
        word in record.lower() for word in ("acc", "f1", "auc", "precision", "recall", "bleu")
    )


# -------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mxoid", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"mxoid {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    records_help = (
        "records to show, by name or shell pattern ('valid_*'), separated by "
        "spaces or commas (default: every record holding numbers)"
    )
    show_parser = commands.add_parser(
        "show",
        help="print a log as a table, a line per row (per epoch for epoch records)",
        description="Print the rows of a JSON-lines or CSV log that hold any of the chosen "
        "records, as a table: iteration, epochs_done, then a column per record "
        "('-' where a row lacks it). Only the last training (a resumed run joined to the "
        "one it resumed), unless --all-runs.",
    )
    show_parser.add_argument("log", metavar="LOG", help="a .jsonl or .csv log file")
    show_parser.add_argument("--records", nargs="+", metavar="NAME", help=records_help)
    show_parser.add_argument(
        "--all-runs",
        action="store_true",
        help="show every run appended to the file, with a run column",
    )
    show_parser.set_defaults(handler=show)

    plot_parser = commands.add_parser(
        "plot",
        help="plot learning curves to an image (needs matplotlib: mxoid[plot])",
        description="Plot the metric records of a log, one panel per metric family "
        "(train_accuracy, valid_accuracy and test_accuracy share the panel 'accuracy'), "
        "against epochs; markers and timings are left out unless named in --records. A "
        "resumed run is drawn as one run; several logs are overlaid. Needs matplotlib: "
        "pip install 'mxoid[plot]'.",
    )
    plot_parser.add_argument(
        "logs", metavar="LOG", nargs="+", help="a .jsonl or .csv log file; several are overlaid"
    )
    plot_parser.add_argument(
        "-o",
        "--output",
        default="curves.png",
        metavar="FILE",
        help="the image to write; its suffix picks the format "
        "(.png, .svg, .pdf) (default: %(default)s)",
    )
    plot_parser.add_argument("--records", nargs="+", metavar="NAME", help=records_help)
    plot_parser.add_argument(
        "--x",
        choices=("epoch", "iteration"),
        default="epoch",
        help="the horizontal axis (default: %(default)s)",
    )
    plot_parser.add_argument("--dpi", type=int, default=100, help="resolution (default: 100)")
    plot_parser.set_defaults(handler=plot)

    native_parser = commands.add_parser(
        "native",
        help="build mxoid's fused metric operator now, instead of in the first loop's background",
        description="Compile mxoid's fused metric operator with the machine's C++ compiler "
        "(CXX, default c++), once per machine and MXNet, into ~/.cache/mxoid "
        "(MXOID_CACHE_DIR), and load it. Without it, the first loop on a machine builds it "
        "in the background and computes its metrics with MXNet's operators until then.",
    )
    native_parser.set_defaults(handler=native)

    average_parser = commands.add_parser(
        "average",
        help="average the best or last N checkpoints of a Checkpoint directory (as Sockeye)",
        description="Average the parameters of a Checkpoint directory's best N checkpoints by "
        "a record of their logs (--best N --by RECORD, lower is better with --min, higher "
        "with --max; by default higher for accuracies) or its last N (--last N), and write "
        "OUT-symbol.json and OUT-0000.params (mx.mod.Module.load(OUT, 0)); for a Gluon "
        "block's checkpoints also OUT.params (block.load_parameters) and OUT-net-symbol.json.",
    )
    average_parser.add_argument("directory", metavar="DIR", help="a Checkpoint directory")
    average_parser.add_argument("--best", type=int, metavar="N", help="the best N by --by")
    average_parser.add_argument("--last", type=int, metavar="N", help="the newest N")
    average_parser.add_argument("--by", metavar="RECORD", help="e.g. valid_cross_entropy")
    direction = average_parser.add_mutually_exclusive_group()
    direction.add_argument("--min", dest="mode", action="store_const", const="min")
    direction.add_argument("--max", dest="mode", action="store_const", const="max")
    average_parser.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="the prefix of the files written"
    )
    average_parser.set_defaults(handler=average)

    add_export_commands(commands)  # export, quantize
    commands.add_parser(
        "launch",
        add_help=False,
        help="run a distributed job: here, on SSH hosts or under SLURM (mxoid launch --help)",
    )
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``mxoid`` command with ``argv`` (``sys.argv[1:]`` by default); return its status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "launch":
        from .distributed.launch import main as launch_main

        return launch_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except InputError as error:
        message = " ".join(str(error).split())
        print(f"mxoid {args.command}: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # mxoid show LOG | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
