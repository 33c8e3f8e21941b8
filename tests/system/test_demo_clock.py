"""The clock file the multi-process tests move and the demo's workers read (demo_app/clock.py).

The end-to-end tests rely on it to hold an open period for as long as they
need: it must stand still until written, never go back, and be read by the
demo only when ``DEMO_CLOCK_FILE`` names it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from demo_app import settings
from demo_app.clock import ClockWriter, FileClock


def test_a_reader_sees_what_the_writer_wrote_and_nothing_else(tmp_path: Path) -> None:
    before = int(time.time() * 1000)
    writer = ClockWriter(tmp_path / "clock")
    assert before <= writer.now_ms <= int(time.time() * 1000)  # starts at the wall-clock time
    reader = FileClock(tmp_path / "clock")
    assert reader() == reader() == writer.now_ms  # stands still
    assert writer.advance(2.5) == reader() == writer.now_ms
    assert writer.advance_to(writer.now_ms + 1) == reader()
    assert [p.name for p in tmp_path.iterdir()] == ["clock"]  # the spare file was moved into place


def test_it_never_goes_back(tmp_path: Path) -> None:
    writer = ClockWriter(tmp_path / "clock", start_ms=10_000)
    reader = FileClock(tmp_path / "clock")
    assert writer.advance_to(9_000) == 10_000
    with pytest.raises(ValueError, match="never goes back"):
        writer.advance(-1)
    ClockWriter(tmp_path / "clock", start_ms=5_000)  # another writer, earlier: the reader keeps its time
    assert reader() == 10_000


def test_a_missing_or_bad_file_fails_when_the_clock_is_made(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FileClock(tmp_path / "absent")
    (tmp_path / "short").write_bytes(b"123")
    with pytest.raises(ValueError, match="holds 8 bytes"):
        FileClock(tmp_path / "short")


def test_the_demo_reads_it_only_when_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_CLOCK_FILE", raising=False)
    assert settings.clock_options() == {}  # FlaskBreakers(app): the breakers' own clock
    monkeypatch.setenv("DEMO_CLOCK_FILE", " ")
    assert settings.clock_options() == {}
    writer = ClockWriter(tmp_path / "clock", start_ms=42_000)
    monkeypatch.setenv("DEMO_CLOCK_FILE", str(tmp_path / "clock"))
    clock = settings.clock_options()["clock"]
    assert isinstance(clock, FileClock) and clock() == writer.now_ms == 42_000
