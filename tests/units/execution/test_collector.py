"""search/execution/collector.py: Python's cyclic collector off while a search starts, on for its trials."""

import gc
import weakref

import pytest

from search.execution.collector import start_up, trials_begin


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


@pytest.fixture
def collector_on():
    """Each test starts with the collector on and nothing frozen, and leaves it so."""
    was_on = gc.isenabled()
    gc.enable()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if not was_on:
        gc.disable()


def test_the_start_runs_without_the_collector_and_the_trials_with_it_over_a_frozen_start(collector_on):
    with start_up():
        assert not gc.isenabled()
        garbage = Cycle()
        dead = weakref.ref(garbage)
        del garbage  # with the collector off, nothing frees it until trials_begin
        assert dead() is not None
        trials_begin()
        assert gc.isenabled()
        assert dead() is None  # the start's garbage was freed, not frozen with the rest
        assert gc.get_freeze_count() > 0  # what was alive is out of the collections' way
        trials_begin()  # once only: a second call neither collects nor freezes again
    assert gc.isenabled() and gc.get_freeze_count() == 0  # the process's collector as it was


def test_a_search_that_ends_before_its_trials_turns_the_collector_back_on(collector_on):
    with pytest.raises(RuntimeError):
        with start_up():
            assert not gc.isenabled()
            raise RuntimeError("a bad space file")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_the_caller_turned_off_stays_off_and_nothing_is_frozen(collector_on):
    gc.disable()
    with start_up():
        trials_begin()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    assert not gc.isenabled()
    gc.enable()


def test_trials_outside_a_start_up_leave_the_collector_alone(collector_on):
    trials_begin()  # a Tuner fitted by a test or a notebook: no start_up around it
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_of_its_own_keeps_them_frozen(collector_on):
    gc.freeze()  # a server that forks, say: its frozen objects are its own
    frozen = gc.get_freeze_count()
    with start_up():
        assert gc.isenabled()  # not paused: unfreezing at the end would take back the caller's too
        trials_begin()
    assert gc.get_freeze_count() >= frozen > 0
