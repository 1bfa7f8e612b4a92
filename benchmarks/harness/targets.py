"""Targets and comparisons of a contest: an entry per limit, its verdict, their table.

An entry is a dict: ``target`` (its text), ``measured``, ``limit``, ``met``, ``unit``
('%', 'x', 'us' or 'MiB'); a ratio of throughputs also carries its 90% ``interval`` and
``within_noise`` (the limit inside it), a target against a slower contender the
reference's own ratio (``floor``), and an entry of a workload that also lists mere
comparisons its ``is_target``.
"""

from typing import List, Optional, Sequence

from harness import contest, report

TARGETS_TEXT = "ratios of throughputs with a 90% bootstrap interval over the processes and their "
TARGETS_TEXT += "rounds; 'missed within noise' when the limit is inside it"


def target(text: str, measured: float, limit: float, unit: str, at_most=False, versus=None):
    """A target's entry; ``versus``: the two rows of a ratio of throughputs (``measured``
    is then their ratio, round by round, with its interval)."""
    interval = None
    if versus is not None:  # a ratio of throughputs: how sure the verdict is
        measured, interval = contest.throughput_ratio(*versus)
    met = measured <= limit if at_most else measured >= limit
    entry = {"target": text, "measured": measured, "limit": limit, "met": met, "unit": unit}
    if interval is not None:
        entry["interval"] = interval
        entry["within_noise"] = interval[0] <= limit <= interval[1]
    return entry


def ratios(rows: List[dict], table: Sequence[tuple], contest_: contest.Contest, floor=False):
    """The entries of ``table`` for every cell of ``rows``: ``(contender, over, limit, a
    target?, where)`` each, ``where`` None or the ``model-batch`` (or a tuple of them) of
    the only cells it applies to; a target reads ``>= LIMITx``, a comparison has no limit
    in its text.
    ``floor``: targets over another contender than the reference carry the reference's
    own ratio over it."""
    keys = contest_.cell_keys
    index = {(r["contender"],) + contest.cell_of(r, keys): r for r in rows}
    index = {key: row for key, row in index.items() if "samples_per_second" in row}
    found = []
    for cell in dict.fromkeys(contest.cell_of(r, keys) for r in rows):
        for contender, over, limit, is_target, where in table:
            mine, theirs = index.get((contender, *cell)), index.get((over, *cell))
            places = (where,) if isinstance(where, str) else where
            if mine is None or theirs is None or (places and f"{cell[0]}-{cell[1]}" not in places):
                continue
            text = f"{contender} over {over}, {contest_.describe(cell)}"
            text += f": >= {limit:.2f}x" if is_target else ""
            entry = target(text, 0.0, limit, "x", versus=(mine, theirs))
            entry["is_target"] = is_target
            reference = index.get((contest_.reference, *cell))
            if floor and is_target and over != contest_.reference and reference is not None:
                entry["floor"] = contest.throughput_ratio(reference, theirs)[0]
            found.append(entry)
    return found


VERDICT_CELLS = {"met": "yes", "MISSED": "**no**", "missed within noise": "no, within noise"}
VERDICT_CELLS["missed by the floor too"] = "no, nor by the hand loop"


def verdict(entry: dict) -> str:
    """``met``, ``MISSED``, ``missed within noise`` (the limit inside the ratio's interval),
    or ``missed by the floor too`` (the hand loop, doing the least work, misses it)."""
    if entry["met"]:
        return "met"
    if entry.get("floor") is not None and entry["floor"] < entry["limit"]:
        return "missed by the floor too"
    return "missed within noise" if entry.get("within_noise") else "MISSED"


def format_measured(entry: dict) -> str:
    """A target's measured value in its unit, with its interval and the floor's ratio."""
    unit, value = entry["unit"], entry["measured"]
    text = {"MiB": f"{value:.0f} MiB", "us": f"{value:.2f} us", "x": f"{value:.2f}x"}
    text = text.get(unit, f"{value:.1%}")
    if "interval" in entry:
        low, high = entry["interval"]
        interval = {"%": f"{low:.0%}-{high:.0%}", "us": f"{low:.1f} to {high:.1f} us"}
        text += f" (90%: {interval.get(unit, f'{low:.2f}-{high:.2f}x')})"
    if entry.get("floor") is not None:
        text += f"; the hand loop: {entry['floor']:.2f}x"
    return text


def table(found: List[dict], title: Optional[str] = None) -> str:
    """The entries as Markdown, their verdicts (``(comparison)`` for those no target)."""
    comparisons = any(not entry.get("is_target", True) for entry in found)
    rows = []
    for entry in found:
        met = VERDICT_CELLS[verdict(entry)] if entry.get("is_target", True) else "(comparison)"
        rows.append([entry["target"], format_measured(entry), met])
    first = "target or comparison" if comparisons else "target"
    title = title or ("Targets and comparisons" if comparisons else "Targets")
    text = report.markdown_table([first, "measured", "met"], rows, "lrl")
    return f"\n{title} ({TARGETS_TEXT})\n\n{text}"
