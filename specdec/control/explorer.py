"""When a drafter predicted to lose drafts all the same, to check its estimate: a probe.

The chooser (`policy.py`) drafts with a drafter where its acceptance estimates predict a gain. One
predicted to lose would never be heard from again (its estimates move only when it drafts), right or
wrong; so now and then it drafts anyway. The rule:

    drafter d is due for a probe once it has gone interval_d rounds without drafting, where

        interval_d = clamp(⌈W_d / PROBE_SHARE⌉, PROBE_MIN, PROBE_MAX)

    and W_d is what the probe would lose if none of its tokens were accepted, in one-token passes as
    the cost table prices them: (T(B, B + n) + D_d) / T(B, B) − 1, n the draft tokens it would verify
    and D_d its drafting (a model drafter's catch-up included). A probe is taken in a round that
    would otherwise be plain; one that has waited PROBE_MAX rounds is taken even instead of a
    drafter that pays. A probe that paid (its tokens were worth more than its pass and draft, at the
    table's prices) is followed by another at the next chance, until one does not pay or the
    estimates predict a gain by themselves.

Its worst case, whatever the drafter's true acceptance (0 included): a scheduled probe and the
probes that follow it lose at most W_d together (every one before the last gained), so its probes
lose at most PROBE_SHARE (0.4%) of a one-token pass a round, or W_d / PROBE_MAX a round where one probe costs more
than PROBE_SHARE · PROBE_MAX passes (a model drafter after a long rest, whose catch-up grows with the
rest); and no drafter goes more than PROBE_MAX (512) rounds without drafting. A lookup's probe
verifies the one prefix of its proposal with the best predicted speed-up (a single token, mostly),
so its W is small and it is probed often; a dear model drafter is probed rarely.

The schedule reads the rounds and the cost table, never a clock: it depends on the tokens alone, the
same in any process. The rounds since each drafter drafted carry on to the next request on the same
engine (`carry_from`), so short requests do not each probe a model drafter at once; a lookup, whose
acceptance depends on the text it finds its matches in, is due at the first round of each request
where it proposes something (a new prompt is a new text: what the last one said of it is weak
evidence), which costs one small probe a request; and every drafter is due at its first chance on a
new engine, where its estimates are the prior alone. The estimates a probe checks are the acceptance
estimates' (`acceptance.py`), which forget old evidence, so a probe or two that pay bring a drafter
back.
"""

from __future__ import annotations

import math

PROBE_SHARE = 0.004  # a probe's worst case spread over the rounds before it: at most this share of a pass a round
PROBE_MIN = 4  # the fewest rounds between probes of one drafter, however cheap
PROBE_MAX = 512  # the most rounds a drafter goes without drafting


def probe_interval(worst_loss: float) -> int:
    """Rounds a drafter rests between probes whose worst case loses `worst_loss` one-token passes."""
    return min(max(math.ceil(worst_loss / PROBE_SHARE - 1e-9), PROBE_MIN), PROBE_MAX)  # (not one more for
    # a rounding error: 0.3 / 0.004 is 75.00000000000001 in floats)


class Explorer:
    """Rounds since each drafter last drafted, and whether a probe of it is due."""

    def __init__(self, drafters: int) -> None:
        self.since = [0] * drafters  # rounds since each drafter last drafted (a probe or a paying round)
        self.fresh = set(range(drafters))  # due at their next chance, whatever the rounds: each drafter on a new
        # engine (its estimate is the prior alone), a lookup on a new request (`carry_from`), a probe that paid

    def tick(self) -> None:
        """A round begins."""
        self.since = [rounds + 1 for rounds in self.since]

    def drafted(self, index: int) -> None:
        """Drafter `index` drafted this round."""
        self.since[index] = 0
        self.fresh.discard(index)

    def due(self, index: int, worst_loss: float) -> bool:
        """Whether drafter `index`, whose probe would lose at most `worst_loss` passes, is due for one."""
        return index in self.fresh or self.since[index] >= probe_interval(worst_loss)

    def overdue(self, index: int) -> bool:
        """Whether drafter `index` has rested PROBE_MAX rounds: probed even instead of a drafter that pays."""
        return self.since[index] >= PROBE_MAX

    def rounds_left(self, index: int, worst_loss: float) -> int:
        """Rounds until drafter `index` is due (0: now)."""
        return 0 if index in self.fresh else max(0, probe_interval(worst_loss) - self.since[index])

    def carry_from(self, earlier: Explorer, fresh: list[int]) -> None:
        """Go on with an earlier request's schedule (the same drafters), the drafters `fresh` (the
        lookups) due at their next chance."""
        self.since = list(earlier.since)
        self.fresh = set(fresh)
