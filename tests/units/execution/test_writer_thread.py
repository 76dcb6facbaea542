"""search/execution/writer_thread.py: the thread Progress and EventFiles write on, off Tune's controller thread."""

import pickle
import threading

from search.execution.writer_thread import WriterThread


def test_calls_run_in_order_on_one_thread_and_an_error_is_said_not_raised(capsys):
    writer, seen = WriterThread("hpsearch-test", "writing a test file"), []

    def fails():
        raise OSError("No space left on device")

    for n in range(3):
        writer.submit(lambda n=n: seen.append((n, threading.current_thread().name)))
    writer.submit(fails)
    writer.submit(seen.append, "after")  # an error does not stop the calls after it
    writer.wait()
    assert [n for n, _ in seen[:3]] == [0, 1, 2] and seen[3] == "after"
    names = {name for _, name in seen[:3]}
    assert len(names) == 1 and names.pop().startswith("hpsearch-test")
    assert "hpsearch: writing a test file failed: No space left on device" in capsys.readouterr().err
    writer.wait()  # nothing pending: returns, says nothing
    assert capsys.readouterr().err == ""


def test_a_pickled_writer_thread_holds_no_thread_and_no_calls():
    writer = WriterThread("hpsearch-test", "writing a test file")
    release = threading.Event()
    writer.submit(release.wait, 60)  # pending while it is pickled, as Tune pickles its callbacks
    copy = pickle.loads(pickle.dumps(writer))
    release.set()
    writer.wait()
    assert (copy.name, copy.what, copy._thread, copy._pending) == ("hpsearch-test", "writing a test file", None, [])
    copy.submit(release.wait, 60)  # and it starts its own at its first call
    copy.wait()
