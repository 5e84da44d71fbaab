"""A training step's context: the flat tuple steps.py makes when a step begins, indexed by the constants below
(``StepTracker._begin`` writes it in this order, in one literal: it runs every step).

It is ``record.STEP[0]`` while the step is open, ``record.RECENT_STEPS`` keeps the last ones begun (the native
capture's records carry a step's serial), and every record made meanwhile keeps it (``record.STEPCTX``). A
tuple of ints, bools and one pair, like the record itself, and the caller's OpenTelemetry context the step
began in (one object, which records made in it hold anyway).
"""

from __future__ import annotations

SERIAL = 0  # steps begun on this rank: a step's key inside the library (the program's numbers may repeat)
TRACE = 1  # the trace the rank's step span is in: the step's shared trace, or the caller's around the step
SPAN = 2  # this rank's step span id (train.rank_step)
SAMPLED = 3  # whether the step is traced
ROOT = 4  # the step's root span id (train.step, which rank 0 emits) in the shared trace
PARENT = 5  # (trace id, span id) of the caller's span around the step, or None
SHARED = 6  # the step's shared trace id, which every rank derives alike (the root's trace)
INDEX = 7  # the step's number, as the program gave it (or counted from 1)
OCCURRENCE = 8  # how many times this number was begun before on this rank
# The caller's OpenTelemetry Context current when the step began, where the step before began in it too (a
# span of the program's around the loop; else None: steps.StepTracker._around): a collective made in it is
# the step's, not that span's child, and is traced as the step is (export/caller_context.py); a span the
# program opens inside the step, or around one iteration, stays its parent.
AROUND = 9
FIELDS = 10


def under(ctx: tuple, trace: int, span: int, sampled: bool, took_over: bool) -> tuple:
    """``ctx`` under the caller's span (``trace``, ``span``, ``sampled``): the rank's step becomes that span's child,
    in its trace, kept when the library picked the step and the caller's span is sampled. A step that took over
    the open one keeps its own trace, whose spans may be out already, and only names the caller's span."""
    if took_over:
        return ctx[:PARENT] + ((trace, span),) + ctx[PARENT + 1 :]
    return (ctx[SERIAL], trace, ctx[SPAN], ctx[SAMPLED] and sampled, ctx[ROOT], (trace, span)) + ctx[SHARED:]
