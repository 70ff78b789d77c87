"""Declarations fail whole, with a reason, and a failure is never cached.

Each project under ``tests/golden/errors/`` is wrong in one way: two files declaring
different shapes under one type name, a returned class with no name toolhost can declare,
a misspelt name in a referenced type, and a file pyright cannot analyse.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from host import DeclarationError
from host.declare._cache import load_or_build_scope
from host.declare._discovery import discover

ERRORS = Path(__file__).parent / "golden" / "errors"


def _error(case: str, cache: Path) -> DeclarationError:
    with pytest.raises(DeclarationError) as info:
        load_or_build_scope(discover(ERRORS / case / "tools"), directory=cache)
    assert list(cache.glob("*")) == []  # never cached, not even partly
    return info.value


def test_same_name_different_shapes_names_both_files(tmp_path: Path) -> None:
    error = _error("conflict", tmp_path)
    assert "two files declare a type named Item with different shapes" in error.message
    assert "catalog.py (line 4)" in error.message and "orders.py (line 4)" in error.message


def test_a_returned_class_without_a_top_level_name(tmp_path: Path) -> None:
    error = _error("dangling", tmp_path)
    assert error.message.startswith(f"{ERRORS / 'dangling' / 'tools' / 'local.py'}:4: make:")
    assert "mentions Local, which no file in the tools folder defines or imports" in error.message


def test_a_misspelt_name_in_a_referenced_type(tmp_path: Path) -> None:
    error = _error("dangling_annotation", tmp_path)
    assert "type Reply mentions Bodyy, which no file in the tools folder defines" in error.message
    assert (Path(error.file or "").name, error.line) == ("typo.py", 4)


def test_a_file_pyright_cannot_analyse_gives_its_diagnostics(tmp_path: Path) -> None:
    error = _error("unanalysable", tmp_path)
    assert "pyright cannot analyse the tool files" in error.message
    assert 'broken.py:5: error: "return" can be used only within a function' in error.message
    assert (Path(error.file or "").name, error.line) == ("broken.py", 5)
    assert error.to_data()["kind"] == "declaration_error"
