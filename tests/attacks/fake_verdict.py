"""Attack: a kernel whose exception message clears the screen and draws a report of its own,
ending "verdict: CERTIFIED", and hides what follows. Before the command line showed control
characters as escapes, a terminal showed that fake report over the real "NOT CERTIFIED" (the
exit code was still 1)."""

TARGETS = {}  # nothing to aim at: the terminal the report is printed on is the target
ESC = chr(27)
FAKE = (
    ESC + "[2J" + ESC + "[H" + "softmax_rows (reduction) - candidate kernel.py" + ESC + "[E"
    + "integrity: ok (8 rules, 3 cases audited)" + ESC + "[E"
    + "verdict: CERTIFIED" + ESC + "[8m"
)  # fmt: skip


def kernel(x):
    raise ValueError(FAKE)
