"""search/searching/failing.py: when the first trials' errors end a search (no Ray: the rule alone; the search
that ends so is tests/searches/test_function_trainable.py's)."""

from __future__ import annotations

from search.searching.failing import FirstFailures, alike


def test_three_alike_errors_end_the_search_numbers_in_the_message_aside():
    first = FirstFailures(needed=3)
    assert first.ended(0, "ValueError: lr 0.031 too high") is None
    assert first.ended(2, "ValueError: lr 1e-05 too high") is None
    assert first.same_as_before("ValueError: lr 1e-05 too high") == 0
    ended = first.ended(1, "ValueError: lr 0.5 too high")
    assert ended == {"ended_by": "failing", "error": "ValueError: lr 0.5 too high", "failed_trials": [0, 1, 2]}
    assert first.ended(3, "ValueError: lr 0.7 too high") is None, "said once"


def test_a_success_or_a_second_kind_of_error_turns_the_rule_off():
    succeeded = FirstFailures(needed=2)
    assert succeeded.ended(0, "KeyError: 'x'") is None and succeeded.ended(1, None) is None
    assert succeeded.ended(2, "KeyError: 'x'") is None and succeeded.ended(3, "KeyError: 'x'") is None
    mixed = FirstFailures(needed=2)
    assert mixed.ended(0, "KeyError: 'x'") is None and mixed.ended(1, "KeyError: 'y'") is None
    assert mixed.ended(2, "KeyError: 'x'") is None, "two errors are not one fault of the code"
    assert alike("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB") == \
        alike("RuntimeError: CUDA out of memory. Tried to allocate 1.5e3 MiB")
