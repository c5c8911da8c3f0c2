"""The cache of generated modules: hits skip black, a changed input misses, --no-cache bypasses."""

from __future__ import annotations

from click.testing import CliRunner

from kernel_cases import ADD_VECTORS_SPEC
from pallasgen.cli import main
from pallasgen.rendering import render
from pallasgen.workspace import cache

SPEC = ADD_VECTORS_SPEC


def project(tmp_path, monkeypatch):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "add.pallas").write_text(SPEC)
    (tmp_path / "pyproject.toml").write_text("[tool.pallasgen]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PALLASGEN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def forbid_formatting(monkeypatch):
    def fail(source):
        raise AssertionError("black ran although the cache holds this module")

    monkeypatch.setattr(render, "format_code", fail)


def test_an_unchanged_spec_is_served_from_the_cache(tmp_path, monkeypatch):
    root = project(tmp_path, monkeypatch)
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    assert len(list((root / "cache").iterdir())) == 1
    forbid_formatting(monkeypatch)
    result = CliRunner().invoke(main, ["check"])
    assert result.exit_code == 0, result.output


def test_an_edited_spec_misses_the_cache(tmp_path, monkeypatch):
    root = project(tmp_path, monkeypatch)
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    (root / "specs" / "add.pallas").write_text(SPEC.replace("1024", "2048"))
    result = CliRunner().invoke(main, ["build"])
    assert result.exit_code == 0, result.output
    assert 'None: {"default": (2048,)}' in (root / "generated" / "add.py").read_text()
    assert len(list((root / "cache").iterdir())) == 2


def test_an_edited_tuning_file_misses_the_cache(tmp_path, monkeypatch):
    root = project(tmp_path, monkeypatch)
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    before = (root / "generated" / "add.py").read_text()
    (root / "specs" / "add.tuning.json").write_text('{"kernels": {}}')
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    assert (root / "generated" / "add.py").read_text() == before  # an empty tuning changes nothing
    assert len(list((root / "cache").iterdir())) == 2


def test_no_cache_neither_reads_nor_writes_it(tmp_path, monkeypatch):
    root = project(tmp_path, monkeypatch)
    assert CliRunner().invoke(main, ["build", "--no-cache"]).exit_code == 0
    assert not (root / "cache").exists()


def test_the_key_covers_the_spec_label_and_generator():
    base = cache.key(SPEC, "specs/add.pallas")
    assert cache.key(SPEC, "specs/add.pallas") == base
    assert cache.key(SPEC + "\n", "specs/add.pallas") != base
    assert cache.key(SPEC, "other/add.pallas") != base
    assert len(cache.generator_fingerprint()) == 64


def _entry(root):
    (entry,) = (root / "cache").iterdir()
    return entry


def test_a_tampered_cache_entry_is_ignored_and_rebuilt(tmp_path, monkeypatch):
    root = project(tmp_path, monkeypatch)
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    good = (root / "generated" / "add.py").read_text()
    entry = _entry(root)
    entry.write_text(entry.read_text().replace("x + y", "x - y"))
    (root / "generated" / "add.py").write_text(good.replace("x + y", "x - y"))
    result = CliRunner().invoke(main, ["check"])
    assert result.exit_code == 1, result.output  # the tampered entry is not trusted
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    assert (root / "generated" / "add.py").read_text() == good
    assert cache.load(entry.stem) == good  # rebuilt in the cache too


def test_a_truncated_cache_entry_is_ignored_and_rebuilt(tmp_path, monkeypatch):
    root = project(tmp_path, monkeypatch)
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    good = (root / "generated" / "add.py").read_text()
    entry = _entry(root)
    entry.write_bytes(entry.read_bytes()[: len(entry.read_bytes()) // 2])
    (root / "generated" / "add.py").unlink()
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    assert (root / "generated" / "add.py").read_text() == good
