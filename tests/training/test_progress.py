"""The training bar: over the steps, or over the time budget when train.max_minutes bounds the run."""

from aiayn.training.config import LoopSection
from aiayn.training.progress import TimeBudgetBar, progress_bar


def test_a_time_budget_shows_seconds_not_a_step_eta():
    bar = progress_bar(LoopSection(max_steps=2000, max_minutes=9.0), 5, enabled=False)
    assert isinstance(bar, TimeBudgetBar) and bar.total == 540.0
    bar.update(1)
    bar.update(1)
    assert bar.step == 7 and bar.desc == "step 7" and 0.0 <= bar.n <= 540.0
    bar.close()


def test_without_a_budget_the_bar_counts_steps():
    bar = progress_bar(LoopSection(max_steps=20), 3, enabled=False)
    assert not isinstance(bar, TimeBudgetBar) and bar.total == 20 and bar.n == 3
    bar.close()
