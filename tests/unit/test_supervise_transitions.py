"""The supervisor's state machine enforces its table: every move it makes is listed, any other fails loudly."""

from __future__ import annotations

import pytest

from coderouterd.state.events import PROCESS_EVENTS, ProcessEventName
from coderouterd.supervise import TRANSITIONS, IllegalTransition, ManagedProcess, ProcessSpec, ProcessState


def _process(tmp_path) -> ManagedProcess:
    return ManagedProcess(ProcessSpec(name="p", command=["true"]), log_dir=tmp_path)


def test_every_state_has_its_moves_listed():
    assert set(TRANSITIONS) == set(ProcessState)
    # Nothing may bypass STOPPING on its way from a live process to STOPPED.
    assert ProcessState.STOPPED not in TRANSITIONS[ProcessState.READY]
    assert ProcessState.STOPPED not in TRANSITIONS[ProcessState.STARTING]


@pytest.mark.parametrize(("old", "new"), [(o, n) for o in ProcessState for n in ProcessState
                                          if n not in TRANSITIONS[o]])
def test_an_illegal_move_fails_loudly_and_leaves_the_state_alone(tmp_path, old, new):
    mp = _process(tmp_path)
    mp.state = old
    with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
        mp._set_state(new)
    assert mp.state is old


def test_a_legal_move_is_made(tmp_path):
    mp = _process(tmp_path)
    mp._set_state(ProcessState.STARTING)
    mp._set_state(ProcessState.READY)
    mp._set_state(ProcessState.STOPPING)
    mp._set_state(ProcessState.STOPPED)
    assert mp.state is ProcessState.STOPPED


def test_process_events_are_one_enum_of_strings():
    assert PROCESS_EVENTS == set(ProcessEventName)
    assert ProcessEventName.RESTARTING == "restarting"  # consumers may compare with plain names
