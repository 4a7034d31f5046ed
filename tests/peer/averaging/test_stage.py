"""A stage's step as :class:`peer.averaging.stage.StageRunner` takes it, with hivemind's real
``StepControl`` attached to a stand-in for its averager process (which reads the step's state when the
cancel signal arrives: the real race's two sides, without its timing): what the runner tells the
step's process when it gives the step up."""

from __future__ import annotations

import pytest
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.utils import MPFuture

from peer.averaging.deadlines import StageDeadlines
from peer.averaging.stage import AveragingTimeouts, NoGroup, StageRunner
from peer.commit.report import CommitReport


class _ProcessSide:
    """The step's futures as its averager process holds them: when the cancel signal arrives, the
    process reads whether the step is cancelled (hivemind's ``_step`` goes on looking if not)."""

    def __init__(self):
        self.control: StepControl | None = None
        self.read_cancelled: bool | None = None  # what it read when the signal arrived

    def set_result(self, _value) -> None:  # the cancel signal
        self.read_cancelled = self.control.cancelled()

    def cancel(self) -> bool:  # the trigger, cancelled with the step
        return True

    def done(self) -> bool:  # the trigger, asked when the step is dropped
        return True


class _Averager:
    """Takes the calls a stage makes; its one step looks for a group until it is cancelled."""

    def __init__(self):
        self.process = _ProcessSide()
        MPFuture()  # hivemind sets its futures' backend up only on a process's first plain MPFuture

    def step(self, **_kwargs) -> StepControl:
        control = StepControl(
            scheduled_time=0.0, deadline=1e12, allow_retries=False, weight=1.0, data_for_gather=b""
        )
        control.attach(self.process, self.process)
        control.stage = AveragingStage.LOOKING_FOR_GROUP
        self.process.control = control
        return control

    def set_allreduce_timeout(self, _seconds) -> None: ...

    def set_target_group_size(self, _size) -> None: ...

    def set_group_bits(self, _bits) -> None: ...

    def check_alive(self) -> None: ...


class _Board:
    """The commit board: empty at the first read, then both partners reported the attempt."""

    peer_id = "me"

    def __init__(self):
        self.reads = 0

    def read(self, _attempt: int) -> dict[str, CommitReport]:
        self.reads += 1
        return {} if self.reads == 1 else {p: CommitReport(ok=True, digest="d") for p in ("p1", "p2")}


def test_a_step_the_stage_gives_up_is_cancelled_before_its_process_hears_of_it():
    """Every other member reported the attempt: the stage cancels its step and goes on alone. The
    process must read the step as cancelled when the signal arrives. hivemind signals first and marks
    the step after: a process that read in between went on looking for a group, joined the next
    attempt's group of three in its peer's place, and its partners waited for a check the peer never
    posted (tests/peer/averaging/test_robust_averaging.py: "no quorum for this result: 1 of 4 roster peer(s)
    hold it, 2 reported a failure or another result")."""
    averager = _Averager()
    runner = StageRunner(StageDeadlines(2.0, 60.0), _Board(), AveragingTimeouts(), leaving=lambda: False)
    with pytest.raises(NoGroup, match="every other member left"):
        runner.run(averager, "cohort", 1, 0, 3, "", units=[("me",), ("p1",), ("p2",)])
    assert averager.process.read_cancelled is True
