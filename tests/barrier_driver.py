"""A search driver for tests/searches/test_cluster.py whose first trials wait for each other.

    python tests/barrier_driver.py SPACE_FILE ADDRESS NAME STARTED_DIR N

Each trial leaves a file in STARTED_DIR and waits until N trials have started before it
trains: the first N trials then provably hold their resources at the same time, so the
test can tell how Ray placed concurrent trials instead of hoping they overlap.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def barrier_trial(started: Path, count: int):
    """The real trainable behind a start barrier; a closure, so Ray pickles it by value."""

    def trial(config, **data):
        from trainable.adapter import tune_trial

        (started / f"{config['seed']}").touch()
        deadline = time.monotonic() + 120
        while len(list(started.iterdir())) < count and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the other trials' files: the barrier itself
        tune_trial(config, **data)

    return trial


def main() -> int:
    space_file, address, name, started, count = sys.argv[1:]
    from search.definition.space import parse_space
    from search.driver import run_search
    from trainable.yaml_file import read_yaml_mapping

    Path(started).mkdir(parents=True, exist_ok=True)
    space = parse_space(read_yaml_mapping(space_file), source=space_file)
    outcome = run_search(space, name=name, address=address, trainable=barrier_trial(Path(started), int(count)))
    print(outcome.summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
