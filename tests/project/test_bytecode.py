"""Setup writes the bytecode of what the lessons import, even under PYTHONDONTWRITEBYTECODE=1
(ddpcourse.course.bytecode): the first run after setup does not compile torch again."""

import importlib.util
import os

from ddpcourse.course import bytecode


def probe_package(tmp_path, monkeypatch):
    package = tmp_path / "course_probe"
    package.mkdir()
    (package / "__init__.py").write_text("from course_probe import inner\n")
    (package / "inner.py").write_text("VALUE = 42\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # as some containers set it
    return [str(package / "__init__.py"), str(package / "inner.py")]


def test_what_an_import_loads_gets_its_bytecode_under_pythondontwritebytecode(
        tmp_path, monkeypatch):
    files = probe_package(tmp_path, monkeypatch)
    sources, compiled, still = bytecode.write_bytecode(("course_probe",))
    assert set(files) <= set(sources)  # the module imported by the package's import, too
    assert still == [] and bytecode.missing_bytecode(files) == []
    assert all(os.path.isfile(importlib.util.cache_from_source(f)) for f in files)


def test_bytecode_missing_or_stale_is_compiled_by_py_compile(tmp_path, monkeypatch):
    files = probe_package(tmp_path, monkeypatch)
    bytecode.write_bytecode(("course_probe",))
    gone = importlib.util.cache_from_source(files[1])
    os.remove(gone)
    stale = importlib.util.cache_from_source(files[0])
    os.utime(stale, (1, 1))  # older than its source
    assert sorted(bytecode.missing_bytecode(files)) == sorted(files)
    _, compiled, still = bytecode.write_bytecode(("course_probe",))
    # The child's import wrote the missing one. It kept the other: an import checks the
    # source's time recorded inside the bytecode, not the file's; py_compile rewrote it.
    assert still == [] and os.path.isfile(gone) and os.path.getmtime(stale) > 1
    assert compiled == [files[0]]


def test_the_list_holds_what_torchrun_and_the_step_scripts_import():
    for name in ("torch.distributed.run", "torch.nn.parallel", "timm", "ddpcourse.data",
                 "torch.distributed.fsdp"):
        assert name in bytecode.MODULES
