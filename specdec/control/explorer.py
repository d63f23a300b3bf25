"""When a drafter predicted to lose drafts all the same, to check its estimate: a probe.

The chooser (`policy.py`) drafts with a drafter where its acceptance estimates predict a gain. One
predicted to lose would never be heard from again (its estimates move only when it drafts), right or
wrong; so now and then it drafts anyway. The rule:

    drafter d is due for a probe once it has gone interval_d rounds without drafting, where

        interval_d = clamp(⌈W_d / share_d⌉, PROBE_MIN, longest_d)

    W_d is what the probe would lose if none of its tokens were accepted, in one-token passes as the
    cost table prices them: (T(B, B + n) + D_d) / T(B, B) − 1, n the draft tokens it would verify
    and D_d its drafting (a model drafter's catch-up included). share_d and longest_d are what it
    could gain: PROBE_SHARE and PROBE_MAX for a drafter that could pay, PROBE_SHARE / DOUBT and
    PROBE_MAX · DOUBT for a model drafter that would lose even at its hopeful acceptance (its
    long-run estimate one standard error up, `acceptance.py`: a drafter seldom accepted, probed often
    enough for the bound to be tight, such as an early exit or a head at T = 1 on a small model). A
    lookup's probe is cheap and its acceptance a property of the text (due at each new request), so it
    is always taken as one that could pay. A probe is taken in a round that would otherwise be plain;
    one that has waited longest_d rounds is taken even instead of a drafter that pays. A probe that
    paid (its tokens were worth more than its pass and draft, at the table's prices) is followed by
    another at the next chance, until one does not pay or the estimates predict a gain by themselves.

Its worst case, whatever the drafter's true acceptance (0 included): a scheduled probe and the
probes that follow it lose at most W_d together (every one before the last gained), so a drafter's
probes lose at most share_d of a one-token pass a round (PROBE_SHARE, 0.4%; a doubtful model drafter
0.05%), or W_d / longest_d a round where one probe costs more than share_d · longest_d passes (a
model drafter after a long rest, whose catch-up grows with the rest: W_d / 512 a round, or W_d / 4096
when doubtful); and no drafter goes more than PROBE_MAX (512) rounds without drafting, or
PROBE_MAX · DOUBT (4,096) when even its hopeful acceptance loses. The price of the doubt: a model
drafter whose true acceptance would pay but whose long-run estimate lies more than a standard error
below it (about one time in six, while the evidence is scant) is found 8× later. A lookup's probe
verifies the one prefix of its proposal with the best predicted speed-up (a single token, mostly), so
its W is small and it is probed often; a dear model drafter is probed rarely.

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
PROBE_MAX = 512  # the most rounds a drafter that could pay goes without drafting
DOUBT = 8  # a model drafter that would lose even at its hopeful acceptance: probed this many times less often


def longest_rest(hopeful: bool = True) -> int:
    """The most rounds a drafter goes without drafting: PROBE_MAX, or PROBE_MAX · DOUBT when even its
    hopeful acceptance would lose."""
    return PROBE_MAX if hopeful else PROBE_MAX * DOUBT


def probe_interval(worst_loss: float, hopeful: bool = True) -> int:
    """Rounds a drafter rests between probes whose worst case loses `worst_loss` one-token passes
    (`hopeful`: it could pay at its hopeful acceptance; if not, its share is PROBE_SHARE / DOUBT)."""
    share = PROBE_SHARE if hopeful else PROBE_SHARE / DOUBT
    return min(max(math.ceil(worst_loss / share - 1e-9), PROBE_MIN), longest_rest(hopeful))  # (not one more
    # for a rounding error: 0.3 / 0.004 is 75.00000000000001 in floats)


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

    def due(self, index: int, worst_loss: float, hopeful: bool = True) -> bool:
        """Whether drafter `index`, whose probe would lose at most `worst_loss` passes, is due for one
        (`hopeful`: as `probe_interval`)."""
        return index in self.fresh or self.since[index] >= probe_interval(worst_loss, hopeful)

    def overdue(self, index: int, hopeful: bool = True) -> bool:
        """Whether drafter `index` has rested its longest: probed even instead of a drafter that pays."""
        return self.since[index] >= longest_rest(hopeful)

    def rounds_left(self, index: int, worst_loss: float, hopeful: bool = True) -> int:
        """Rounds until drafter `index` is due (0: now)."""
        return 0 if index in self.fresh else max(0, probe_interval(worst_loss, hopeful) - self.since[index])

    def carry_from(self, earlier: Explorer, fresh: list[int]) -> None:
        """Go on with an earlier request's schedule (the same drafters), the drafters `fresh` (the
        lookups) due at their next chance."""
        self.since = list(earlier.since)
        self.fresh = set(fresh)
