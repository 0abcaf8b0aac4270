"""The suite's time budget, visible: each test module's time in a run (its tests' setup, call
and teardown summed, on whichever worker ran them) against its budget in
tests/time_budgets.toml, for the run's phase (`sqlite`, or `postgres` on PostgreSQL + Redis).
A module over its budget is named in a warning at the end of the run; it fails nothing (the
machines are noisy), but a slow test is seen the day it lands. A module the table does not
name has the phase's `default` budget.

`MSHIP_TEST_BUDGETS_OUT=FILE make test` adds every module's time in each phase to FILE, as
the table's TOML: what a new table is set from (README, Development)."""

from __future__ import annotations

import os
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest
    from _pytest.terminal import TerminalReporter

TABLE = Path(__file__).resolve().parent / "time_budgets.toml"


def phase() -> str:
    """The run's phase, as the table names it: by its database, as `make test` runs them."""
    url = os.environ.get("DATABASE_URL", "")
    return "postgres" if url.startswith(("postgres://", "postgresql://")) else "sqlite"


def budgets(name: str) -> tuple[dict[str, float], float]:
    """The phase's budgets by module, and its default."""
    table = tomllib.loads(TABLE.read_text())
    section = table.get(name, {})
    default = float(section.pop("default", 60))
    return {module: float(seconds) for module, seconds in section.items()}, default


def module_of(nodeid: str) -> str:
    return nodeid.partition("::")[0]


def over_budget(
    times: dict[str, float], own: dict[str, float], default: float
) -> list[tuple[str, float, float]]:
    """The modules whose time passed their budget: (module, seconds, budget), slowest first."""
    over = [(m, t, own.get(m, default)) for m, t in times.items() if t > own.get(m, default)]
    return sorted(over, key=lambda row: row[1] - row[2], reverse=True)


class TimeBudget:
    def __init__(self) -> None:
        self.times: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.times[module_of(report.nodeid)] += report.duration

    def pytest_terminal_summary(self, terminalreporter: TerminalReporter) -> None:
        if not self.times:  # nothing ran: --collect-only, a run refused at its start
            return
        name = phase()
        own, default = budgets(name)
        over = over_budget(self.times, own, default)
        total = sum(self.times.values())
        terminalreporter.section(f"time budget ({name}: tests/time_budgets.toml)")
        terminalreporter.write_line(
            f"{len(self.times)} modules, {total:.0f} s of tests on all workers;"
            f" {len(over)} over their budget"
        )
        for module, seconds, budget in over:
            # "WARNING" at the line's start: what a CI log viewer shows as one.
            terminalreporter.write_line(
                f"WARNING: {module} took {seconds:.0f} s, over its budget of {budget:.0f} s"
                f" ({'its own' if module in own else 'the default'})",
                yellow=True,
            )
        out = os.environ.get("MSHIP_TEST_BUDGETS_OUT")
        if out:
            lines = [f"[{name}]"]
            lines += [f'"{m}" = {t:.1f}' for m, t in sorted(self.times.items())]
            with Path(out).open("a") as file:
                file.write("\n".join(lines) + "\n\n")


def pytest_configure(config: pytest.Config) -> None:
    """On the process that reports (xdist's controller, or the only one): not on workers."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(TimeBudget(), "modelship-time-budget")
