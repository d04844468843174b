"""Progress bars: redrawn in place on a terminal, sparse in a log file."""

from __future__ import annotations

import io

from specagent.runtime.progress import LOG_INTERVAL_S, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_written_to_a_log_draws_at_most_once_in_a_while():
    log = io.StringIO()
    with progress(total=1000, desc="episodes", file=log) as bar:
        for n in range(1000):
            bar.set_postfix(task=n, refresh=False)  # as the episode loop does: drawn by update()
            bar.update(1)
    assert bar.mininterval == LOG_INTERVAL_S
    assert log.getvalue().count("episodes") <= 3  # the first draw, perhaps one more, the last


def test_a_bar_on_a_terminal_keeps_tqdm_defaults():
    with progress(total=3, desc="episodes", file=Terminal()) as bar:
        bar.update(3)
    assert bar.mininterval < 1
