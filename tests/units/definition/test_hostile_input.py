"""Hostile input: every bad file is a ConfigError naming it, never a traceback, a hang or a blown memory.

Each test builds a real file in tmp_path. The limits make the slow cases fast by construction:
a huge file is read only up to the size limit, a bomb is refused before any value is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

import search.store.storage
from search.store.storage import Storage
from trainable.errors import ConfigError, problem
from trainable.yaml_file import (MAX_ALIAS_NODES, MAX_ALIASES, MAX_DEPTH, MAX_FILE_BYTES, parse_value,
                                 read_yaml_mapping)

REPO = Path(__file__).resolve().parents[3]


def refused(path: Path) -> str:
    """The message read_yaml_mapping's ConfigError gives for `path` (it must name the file)."""
    with pytest.raises(ConfigError) as caught:
        read_yaml_mapping(path)
    text = str(caught.value)
    assert str(path) in text
    return text


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """'Billion laughs': each anchor lists the one before `width` times (9 ** 9 leaves written out)."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_a_file_over_the_size_limit_is_refused_without_reading_it_all(tmp_path):
    path = tmp_path / "huge.yaml"
    size = 50 * 1024 * 1024
    with open(path, "wb") as out:  # sparse where the filesystem allows: cheap to make
        out.write(b"lr: ")
        out.truncate(size)
    text = refused(path)
    assert f"at most {MAX_FILE_BYTES} bytes" in text
    assert f"got {size} bytes" in text


def test_a_file_at_the_size_limit_is_read(tmp_path):
    path = tmp_path / "big.yaml"
    head = b"note: "
    path.write_bytes(head + b"x" * (MAX_FILE_BYTES - len(head)))
    assert len(read_yaml_mapping(path)["note"]) == MAX_FILE_BYTES - len(head)


def test_bytes_that_are_not_utf8_name_the_file_and_the_offset(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"lr: 0.1\nname: caf\xe9\n")
    text = refused(path)
    assert "UTF-8" in text
    assert "byte offset 17" in text
    assert "line 2" in text


def test_deep_nesting_is_a_config_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("lr: " + "[" * 1000 + "]" * 1000 + "\n")
    text = refused(path)
    assert f"nested deeper than {MAX_DEPTH} levels" in text
    assert "line 1" in text


def test_deep_block_nesting_is_refused_too(tmp_path):
    path = tmp_path / "deep_block.yaml"
    path.write_text("".join(" " * i + f"k{i}:\n" for i in range(2 * MAX_DEPTH)))
    assert f"nested deeper than {MAX_DEPTH} levels" in refused(path)


def test_nesting_within_the_limit_is_read(tmp_path):
    path = tmp_path / "nested.yaml"
    depth = MAX_DEPTH - 2  # the top mapping and its value take two levels
    path.write_text("lr: " + "[" * depth + "1" + "]" * depth + "\n")
    value = read_yaml_mapping(path)["lr"]
    for _ in range(depth):
        value = value[0]
    assert value == 1


def test_an_alias_bomb_under_an_unknown_key_is_refused_before_it_is_built(tmp_path):
    path = tmp_path / "bomb.yaml"
    body = alias_bomb().replace("\n", "\n  ")
    path.write_text(f"experiment:\n  num_samples: 2\nnot_a_section:\n  {body}\n")
    text = refused(path)
    assert f"at most {MAX_ALIAS_NODES} are allowed" in text
    assert len(text) < 1000


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("space: &a {lr: *a}\n")
    assert "refers to a node that contains it" in refused(path)


def test_too_many_aliases_are_refused(tmp_path):
    path = tmp_path / "aliases.yaml"
    path.write_text("one: &one 1\nmany: [" + ", ".join(["*one"] * (MAX_ALIASES + 1)) + "]\n")
    assert f"more than {MAX_ALIASES} aliases" in refused(path)


def test_a_few_aliases_still_work(tmp_path):
    path = tmp_path / "shared.yaml"
    path.write_text("defaults: &d {lr: 1e-3, sizes: [64, 32]}\nrun:\n  <<: *d\n  epochs: 2\nagain: *d\n")
    data = read_yaml_mapping(path)
    assert data["run"] == {"lr": 0.001, "sizes": [64, 32], "epochs": 2}
    assert data["again"] == {"lr": 0.001, "sizes": [64, 32]}


@pytest.mark.parametrize("content, line, first", [
    ("space:\n  lr: {low: 0.01}\n  batch_size: {values: [32]}\n  lr: {low: 0.1}\n", 4, 2),
    ("experiment: {name: a, seed: 1, name: b}\n", 1, 1),
    ("training: {epochs: 2}\ntraining: {epochs: 3}\n", 2, 1),
])
def test_a_key_written_twice_is_refused_not_silently_replaced(tmp_path, content, line, first):
    path = tmp_path / "twice.yaml"
    path.write_text(content)
    text = refused(path)
    assert f"at line {line}, column" in text and f"written twice in one mapping (first on line {first})" in text


@pytest.mark.parametrize("content, key, expected", [
    ("defaults: &d {lr: 0.1, epochs: 2}\nrun:\n  <<: *d\n  lr: 0.5\n", "run", {"lr": 0.5, "epochs": 2}),
    # a merge chain whose middle mapping sits deeper than the one merging it: PyYAML flattens the
    # middle one first, so a check after flattening saw its override next to the key it overrides
    ("a: &a {x: 1}\ndeep:\n  inner: &b {<<: *a, x: 2}\nc: {<<: *b, y: 3}\n", "c", {"x": 1, "y": 3}),
    ("a: &a {x: 1}\nl:\n  - &b {<<: *a, x: 2}\nc: {<<: *b, y: 3}\n", "l", [{"x": 2}]),
])
def test_a_merged_key_may_still_be_overridden(tmp_path, content, key, expected):
    path = tmp_path / "merged.yaml"
    path.write_text(content)
    assert read_yaml_mapping(path)[key] == expected


def test_a_command_line_value_with_a_key_written_twice_is_refused_not_read_as_text():
    with pytest.raises(ConfigError) as caught:
        parse_value("{distribution: loguniform, low: 0.001, low: 0.1, high: 0.2}")
    assert "the key 'low' is written twice in one mapping" in str(caught.value)


def test_python_tags_are_rejected(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "python.yaml"
    path.write_text(f"lr: !!python/object/apply:os.system ['touch {marker}']\n"
                    "opt: !!python/object:argparse.Namespace {a: 1}\n")
    text = refused(path)
    assert "could not determine a constructor" in text
    assert "python/object" in text
    assert not marker.exists()


@pytest.mark.parametrize("content, expected", [
    ("when: 2020-13-45\n", "month must be in 1..12"),
    ("big: " + "1" * 5000 + "\n", "line 1, column 6"),
    ("nul: a\x00b\n", "line 1, column 7"),
])
def test_values_python_cannot_build_are_config_errors(tmp_path, content, expected):
    path = tmp_path / "values.yaml"
    path.write_text(content)
    assert expected in refused(path)


def test_invalid_yaml_still_gives_line_and_column(tmp_path):
    path = tmp_path / "syntax.yaml"
    path.write_text("lr: 0.1\nspace: [1, 2\n")
    assert "invalid YAML at line 3, column 1" in refused(path)


def test_parse_value_keeps_plain_text_and_refuses_hostile_text():
    assert parse_value("1e-3") == 0.001
    assert parse_value("[256, 128]") == [256, 128]
    assert parse_value("a: b: c") == "a: b: c"  # not YAML: the text as typed
    for hostile in ["[" * 1000, "{" + alias_bomb().replace("\n", ", ") + "}", "&a [*a]", "x" * (1 << 20)]:
        with pytest.raises(ConfigError) as caught:
            parse_value(hostile)
        assert len(str(caught.value)) < 1000


def test_a_huge_value_is_cut_in_a_problem_message():
    value = "x" * 42_000_000
    line = problem("space.lr", "must be a number", value)
    assert line.startswith("space.lr: must be a number, got 'xxx")
    assert line.endswith("... (42000000 characters)")
    assert len(line) < 300


def test_a_small_value_is_shown_as_repr_shows_it():
    value = {"low": 1e-3, "values": [256, 12.5], "name": "sgd", "zeta": None, "alpha": True}
    assert problem("k", "rule", value) == f"k: rule, got {value!r}"


def test_a_shared_or_recursive_value_gives_a_short_message():
    bomb = ["lol"] * 9
    for _ in range(30):  # 9 ** 30 leaves written out; a plain repr would never finish
        bomb = [bomb] * 9
    loop: list = []
    loop.append(loop)
    huge_key = "k" * 10_000
    for key, value in [("bomb", bomb), ("loop", loop), (huge_key, {huge_key: bomb})]:
        line = problem(key, "unknown key", value)
        assert len(line) < 600
        error = ConfigError([line])
        assert len(str(error)) < 700


@pytest.mark.parametrize("target_exists", [True, False], ids=["to a file", "dangling"])
def test_write_does_not_follow_a_planted_symlink(tmp_path, monkeypatch, target_exists):
    """A link planted at the very temporary name the write uses is never written through."""
    outside = tmp_path / "outside.txt"
    if target_exists:
        outside.write_bytes(b"precious")
    root = tmp_path / "runs"
    (root / "x").mkdir(parents=True)
    # the temporary name's random part, made known so the link sits where the bytes would go
    known = uuid.UUID(int=0x5EED)
    monkeypatch.setattr(search.store.storage, "uuid", SimpleNamespace(uuid4=lambda: known))
    link = root / "x" / f".results.bin.{known.hex}.tmp"
    link.symlink_to(outside)
    with pytest.raises(OSError):
        Storage.at(str(root)).write("x/results.bin", b"data")
    if target_exists:
        assert outside.read_bytes() == b"precious", "written through the link"
    else:
        assert not outside.exists(), "created through the link"
    assert link.is_symlink(), "the planted link is left as it was, not replaced by our file"
    assert not (root / "x" / "results.bin").exists(), "no half-written result either"


def test_write_replaces_a_symlink_at_the_target_instead_of_writing_through_it(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious")
    root = tmp_path / "runs"
    (root / "x").mkdir(parents=True)
    (root / "x" / "best.yaml").symlink_to(outside)
    Storage.at(str(root)).write("x/best.yaml", b"lr: 0.1\n")
    assert outside.read_bytes() == b"precious"
    assert not (root / "x" / "best.yaml").is_symlink()
    assert (root / "x" / "best.yaml").read_bytes() == b"lr: 0.1\n"


def test_write_leaves_no_temporary_file_and_reads_back(tmp_path):
    storage = Storage.at(str(tmp_path / "runs"))
    storage.write("name/results.parquet", b"one")
    storage.write("name/results.parquet", b"two")
    assert storage.read("name/results.parquet") == b"two"
    assert sorted(os.listdir(tmp_path / "runs" / "name")) == ["results.parquet"]


def test_a_failed_write_removes_its_temporary_file(tmp_path):
    root = tmp_path / "runs"
    (root / "x" / "results.bin").mkdir(parents=True)  # a folder where the file should go
    (root / "x" / "results.bin" / "keep").write_bytes(b"")
    with pytest.raises(OSError):
        Storage.at(str(root)).write("x/results.bin", b"data")
    assert sorted(os.listdir(root / "x")) == ["results.bin"]


def test_write_through_a_pyarrow_filesystem_leaves_no_temporary_file(tmp_path):
    import pyarrow.fs as pafs

    class SubTreeStorage(Storage):
        """A non-local pyarrow filesystem (a subtree), reached the way a URI's would be."""

        def _fs(self):
            return pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()), self.uri

    storage = SubTreeStorage("runs")
    storage.write("name/best.yaml", b"lr: 0.1\n")
    assert (tmp_path / "runs" / "name" / "best.yaml").read_bytes() == b"lr: 0.1\n"
    assert os.listdir(tmp_path / "runs" / "name") == ["best.yaml"]


@pytest.mark.parametrize("name, content", [
    ("latin1.yaml", b"lr: 0.1\nname: caf\xe9\n"),
    ("deep.yaml", b"lr: " + b"[" * 1000 + b"]" * 1000 + b"\n"),
])
def test_the_trainable_cli_exits_2_naming_the_file(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # timeout only guards against a hang; the run ends at the config error
    done = subprocess.run([sys.executable, "-m", "trainable", "--config", str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert str(path) in done.stderr
