"""Joining a cluster: a `ray start --head` cluster of Ray 2.60 wants token authentication, and the
message says what to set instead of only "cannot join"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.heads import own_head

REPO = Path(__file__).resolve().parents[3]
JOIN = "from search.execution.session import start_ray; import sys, ray; start_ray(sys.argv[1], 30); print('joined'); ray.shutdown()"
CLI_LIKE = ("import sys\nfrom search.execution.session import start_ray\nfrom trainable.errors import ConfigError\n"
            "try:\n    start_ray(sys.argv[1], 30)\nexcept ConfigError as error:\n    print(error); sys.exit(2)\n")


@pytest.fixture
def head():
    """A head started as a user would (`ray start --head`), without token authentication in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    with own_head("hp-ray-", "--num-cpus=1", "--include-dashboard=false", env=env) as (port, _, _):
        yield f"127.0.0.1:{port}"


@pytest.mark.slow
def test_a_token_cluster_says_what_to_set_and_joins_once_it_is_set(head):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    refused = subprocess.run([sys.executable, "-c", CLI_LIKE, head], capture_output=True, text=True, env=env,
                             cwd=REPO, timeout=120)
    assert refused.returncode == 2, refused.stderr[-2000:]
    # the head's own answer (ray_internals.token_refusal), not ray.init's ConnectionError after ~20 s of retries
    assert "--address: cannot join a Ray cluster there: the head refused this client" in refused.stdout
    assert "InvalidAuthToken" in refused.stdout and "RAY_AUTH_MODE=token" in refused.stdout
    wrong = subprocess.run([sys.executable, "-c", CLI_LIKE, head], capture_output=True, text=True, cwd=REPO,
                           env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}, timeout=180)
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert "the head refused this client" in wrong.stdout
    assert "; the token this client sends (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) is not the " \
           "head's" in wrong.stdout
    joined = subprocess.run([sys.executable, "-c", JOIN, head], capture_output=True, text=True,
                            env={**env, "RAY_AUTH_MODE": "token"}, cwd=REPO, timeout=120)
    assert joined.returncode == 0 and "joined" in joined.stdout, joined.stderr[-2000:]
