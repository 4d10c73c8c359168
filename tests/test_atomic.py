"""The project's one atomic-publish helpers: readers see the old file (or directory) or the whole new one."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.atomic import atomic_path, publish_dir, write_json_atomic, write_text_atomic


def test_writes_create_parents_replace_the_file_and_leave_no_temporary(tmp_path):
    path = tmp_path / "a" / "b" / "state.json"
    write_json_atomic(path, {"offsets": [1, 2]})
    write_json_atomic(path, {"offsets": [3]})
    assert json.loads(path.read_text()) == {"offsets": [3]}
    assert path.read_text().endswith("\n")
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]


def test_nan_survives_the_json_form(tmp_path):
    write_json_atomic(tmp_path / "m.json", {"auc": float("nan")})
    assert math.isnan(json.loads((tmp_path / "m.json").read_text())["auc"])


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "manifest.json"
    write_text_atomic(path, "old\n")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(path) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("disk full")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_the_new_content_is_invisible_until_the_block_ends(tmp_path):
    path = tmp_path / "scores.txt"
    write_text_atomic(path, "v1")
    with atomic_path(path, durable=False) as tmp:
        tmp.write_text("v2")
        assert path.read_text() == "v1"
        assert tmp.parent == path.parent and tmp.name.startswith(".")  # same filesystem, hidden
    assert path.read_text() == "v2"


def build(directory, files: dict[str, str]):
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    return directory


def test_a_directory_is_published_whole_and_replaces_the_previous_one(tmp_path):
    final = tmp_path / "step-1"
    assert publish_dir(build(tmp_path / ".tmp-step-1", {"a.pt": "1", "sub/b.pt": "2"}), final) is False
    assert publish_dir(build(tmp_path / ".tmp-step-1", {"a.pt": "new"}), final) is False
    assert sorted(str(p.relative_to(final)) for p in final.rglob("*")) == ["a.pt"]
    assert (final / "a.pt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]  # no staging, no .old- left


def test_an_existing_directory_is_kept_when_the_caller_says_it_holds_the_same_content(tmp_path):
    final = tmp_path / "v-abc"
    publish_dir(build(tmp_path / ".build-1", {"shard.parquet": "x"}), final)
    assert publish_dir(build(tmp_path / ".build-2", {"shard.parquet": "y"}), final, keep_existing=True) is True
    assert (final / "shard.parquet").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v-abc"]
    # Nothing there yet: keep_existing publishes.
    assert publish_dir(build(tmp_path / ".build-3", {"s": "z"}), tmp_path / "v-new", keep_existing=True) is False
