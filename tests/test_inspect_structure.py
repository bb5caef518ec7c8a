"""dflashkit.inspect: structure findings, summary, report formats, exit codes and the check registry."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from test_gguf_reader import last_tensor_end, patch, tensor_field_offsets, write_gguf
from test_safetensors_reader import write_checkpoint, write_raw

from dflashkit.errors import DFlashError, UsageError
from dflashkit.inspect import Finding, InspectReport, Severity, inspect_paths, register_check
from dflashkit.inspect import checks as checks_mod
from dflashkit.inspect.findings import warning


@pytest.fixture()
def good(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "good.gguf")


STRUCTURE_PREFIXES = ("gguf.", "safetensors.", "inspect.")


def structural(findings: list[Finding]) -> list[Finding]:
    """Findings of the structure layer (other check modules may add their own, e.g. info notes)."""
    return [f for f in findings if f.id.startswith(STRUCTURE_PREFIXES)]


def ids(report: InspectReport, i: int = 0) -> set[str]:
    return {f.id for f in report.files[i].findings}


def only(path: Path) -> InspectReport:
    return inspect_paths([str(path)])


def assert_finding(path: Path, check_id: str, *words: str, severity: Severity = Severity.ERROR) -> Finding:
    report = only(path)
    found = [f for f in report.files[0].findings if f.id == check_id]
    assert found, report.to_text()
    f = found[0]
    assert f.severity is severity and "\n" not in f.message
    for w in words:
        assert w in f.message, f.message
    assert report.exit_code() == (1 if severity is Severity.ERROR else 0)
    return f


# --- clean files and the summary ------------------------------------------------------------------


def test_good_gguf_summary_and_outputs(good: Path) -> None:
    report = only(good)
    assert report.exit_code() == 0 and report.exit_code(strict=True) == 0
    fr = report.files[0]
    assert fr.kind == "gguf" and structural(fr.findings) == []
    s = fr.summary
    assert s["arch"] == "qwen3" and s["tensor_count"] == 4 and s["version"] == 3 and s["size"] == good.stat().st_size
    mix = s["quant_mix"]
    assert set(mix) == {"F32", "F16", "Q8_0", "I32"}
    assert mix["Q8_0"] == {"count": 1, "bytes": 4 * 2 * 34, "elements": 256, "bpw": 8.5}
    assert mix["F16"]["bpw"] == 16.0
    total_bytes = sum(m["bytes"] for m in mix.values())
    assert s["bpw"] == pytest.approx(8 * total_bytes / sum(m["elements"] for m in mix.values()))
    text = report.to_text()
    assert str(good) in text and "qwen3" in text and "Q8_0" in text and "8.50 bpw" in text and "exit 0" in text
    doc = json.loads(report.to_json())
    assert doc["exit_code"] == 0 and doc["files"][0]["summary"]["quant_mix"]["Q8_0"]["bpw"] == 8.5


def test_good_checkpoint_summary(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "ck", shards=2)
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    report = only(d)
    fr = report.files[0]
    assert report.exit_code() == 0 and fr.kind == "safetensors" and structural(fr.findings) == []
    assert fr.summary["arch"] == "Qwen3ForCausalLM" and fr.summary["files"] == 2 and fr.summary["tensor_count"] == 4
    assert fr.summary["quant_mix"]["F32"]["bpw"] == 32.0 and fr.summary["quant_mix"]["BOOL"]["bpw"] == 8.0


def test_many_files_one_call(good: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.gguf"
    short.write_bytes(good.read_bytes()[: last_tensor_end(good) - 1])
    report = inspect_paths([str(good), str(short), str(write_checkpoint(tmp_path / "ck"))])
    assert [f.exit_code() for f in report.files] == [0, 1, 0]
    assert report.exit_code() == 1
    doc = json.loads(report.to_json())
    assert doc["errors"] == 1 and len(doc["files"]) == 3
    for f in doc["files"][1]["findings"]:
        assert set(f) == {"id", "severity", "message", "values"}
    trunc = next(f for f in doc["files"][1]["findings"] if f["id"] == "gguf.truncated")
    assert trunc["values"]["missing"] == 1 and trunc["values"]["file"] == str(short)


def test_no_paths_is_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        inspect_paths([])
    assert info.value.exit_code == 2


# --- GGUF structure findings ----------------------------------------------------------------------


def test_truncated_one_byte_short(good: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    end = last_tensor_end(good)
    cut.write_bytes(good.read_bytes()[: end - 1])
    f = assert_finding(cut, "gguf.truncated", str(cut), "tensor.i32", "1 bytes missing")
    assert f.values["end"] == end
    cut.write_bytes(good.read_bytes()[:end])  # every tensor byte present: clean
    assert only(cut).exit_code() == 0


def test_bad_magic_and_version(good: Path, tmp_path: Path) -> None:
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"XXXX" + good.read_bytes()[4:])
    assert_finding(bad, "gguf.magic", "not a GGUF file")
    assert_finding(patch(good, tmp_path / "v.gguf", 4, "<I", 4), "gguf.version", "version 4")


def test_absurd_counts_and_lengths(good: Path, tmp_path: Path) -> None:
    assert_finding(patch(good, tmp_path / "n.gguf", 8, "<Q", 2**63), "gguf.tensor_count", str(2**63))
    assert_finding(patch(good, tmp_path / "k.gguf", 16, "<Q", 2**63), "gguf.kv_count", str(2**63))
    assert_finding(patch(good, tmp_path / "s.gguf", 24, "<Q", 2**40), "gguf.string_length", str(2**40))


def test_offset_problems_all_reported(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    bad = patch(good, tmp_path / "o.gguf", tensor_field_offsets(data, "tensor.f16")["offset"], "<Q", 4)
    patch(bad, bad, tensor_field_offsets(data, "tensor.i32")["type"], "<I", 999)
    report = only(bad)
    assert {"gguf.tensor_offset", "gguf.tensor_overlap", "gguf.tensor_type"} <= ids(report)
    assert "gguf.tensor_layout" not in ids(report)  # not piled on top of broken offsets
    assert report.exit_code() == 1


def test_gap_between_tensors_breaks_llama_cpp_layout(good: Path, tmp_path: Path) -> None:
    at = tensor_field_offsets(good.read_bytes(), "tensor.i32")["offset"]
    (orig,) = struct.unpack_from("<Q", good.read_bytes(), at)
    bad = patch(good, tmp_path / "gap.gguf", at, "<Q", orig + 32)
    bad.write_bytes(bad.read_bytes() + b"\0" * 32)
    f = assert_finding(bad, "gguf.tensor_layout", "tensor.i32", f"expected {orig}", "llama.cpp")
    assert f.values == {"tensor": "tensor.i32", "offset": orig + 32, "expected": orig}


def test_trailing_bytes_is_info_only(good: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra.gguf"
    extra.write_bytes(good.read_bytes() + b"\0" * 100)
    assert_finding(extra, "gguf.trailing_bytes", "100 bytes", severity=Severity.INFO)
    assert only(extra).exit_code(strict=True) == 0


def test_missing_architecture_is_warning_and_strict_fails(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes().replace(b"general.architecture", b"general.architecturX")
    (tmp_path / "noarch.gguf").write_bytes(data)
    assert_finding(tmp_path / "noarch.gguf", "gguf.architecture", "general.architecture", severity=Severity.WARNING)
    report = inspect_paths([str(tmp_path / "noarch.gguf")], strict=True)
    assert report.exit_code() == 1 and report.exit_code(strict=False) == 0
    assert "(strict)" in report.to_text()


# --- paths that are not files to parse ---------------------------------------------------------------


def test_directory_empty_missing(tmp_path: Path) -> None:
    empty_dir = tmp_path / "d"
    empty_dir.mkdir()
    assert_finding(empty_dir, "safetensors.no_checkpoint", str(empty_dir))
    (tmp_path / "e.gguf").write_bytes(b"")
    assert_finding(tmp_path / "e.gguf", "gguf.empty", "empty")
    (tmp_path / "e.bin").write_bytes(b"")
    assert_finding(tmp_path / "e.bin", "inspect.empty", "empty")
    assert_finding(tmp_path / "nope.gguf", "inspect.not_found", "no such file")


def test_unknown_format_with_hint(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04" + b"\0" * 60)
    assert_finding(tmp_path / "pytorch_model.bin", "inspect.unknown_format", "PyTorch", "convert it to safetensors")


def test_content_sniffing_without_suffix(good: Path, tmp_path: Path) -> None:
    (tmp_path / "model").write_bytes(good.read_bytes())
    assert only(tmp_path / "model").files[0].kind == "gguf"
    d = write_checkpoint(tmp_path / "ck")
    (tmp_path / "weights").write_bytes((d / "model.safetensors").read_bytes())
    assert only(tmp_path / "weights").files[0].kind == "safetensors"


def test_fifo_does_not_hang(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(tmp_path / "p.gguf")
    assert_finding(tmp_path / "p.gguf", "inspect.not_a_file", "not a regular file")


def test_permission_denied_simulated(good: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # chmod 000 does not stop root, so simulate the EACCES an ordinary user gets.
    import dflashkit.io.gguf_reader as reader

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(reader, "open", denied, raising=False)
    assert_finding(good, "gguf.unreadable", "Permission denied")


# --- safetensors findings ---------------------------------------------------------------------------


def test_safetensors_findings(tmp_path: Path) -> None:
    p = write_raw(tmp_path / "h.safetensors", {}, header_length=2**40)
    assert_finding(p, "safetensors.header_length", str(2**40))
    p = write_raw(tmp_path / "d.safetensors", {"w": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    assert_finding(p, "safetensors.dtype", "'w'", "X9")
    p = write_raw(tmp_path / "o.safetensors", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    assert_finding(p, "safetensors.truncated", "'w'", "8 bytes missing")


def test_missing_shard_and_unlisted_tensor(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "ck", shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    dropped = next(iter(index["weight_map"]))
    del index["weight_map"][dropped]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    f = assert_finding(d, "safetensors.index_unlisted_tensor", dropped, severity=Severity.WARNING)
    assert f.values["count"] == 1
    (d / "model-00002-of-00002.safetensors").unlink()
    assert_finding(d, "safetensors.index_missing_shard", "model-00002-of-00002.safetensors", "re-download")


# --- registry ---------------------------------------------------------------------------------------


def test_registered_checks_run_and_crashing_check_is_contained(good: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks_mod, "_REGISTRY", dict(checks_mod._REGISTRY))  # restored afterwards

    @register_check("test.dialect", kinds=("gguf",), order=500)
    def dialect(ctx: checks_mod.InspectContext):  # type: ignore[no-untyped-def]
        ctx.summary["dialect"] = "test-dialect"
        yield warning("test.dialect", f"{ctx.path}: target={ctx.target} expect={ctx.expect}")

    @register_check("test.crash", kinds=("gguf",), order=501)
    def crash(ctx: checks_mod.InspectContext):  # type: ignore[no-untyped-def]
        raise ZeroDivisionError("boom")

    report = inspect_paths([str(good)], target="t.gguf", expect="x")
    fr = report.files[0]
    assert fr.summary["dialect"] == "test-dialect" and "dialect test-dialect" in report.to_text()
    assert any(f.id == "test.dialect" and "target=t.gguf expect=x" in f.message for f in fr.findings)
    crashed = [f for f in fr.findings if f.id == "inspect.internal_error"]
    assert len(crashed) == 1 and "test.crash" in crashed[0].message and "ZeroDivisionError" in crashed[0].message
    assert report.exit_code() == 1


# --- rendering through reporting.Report ------------------------------------------------------------


def _two_file_report() -> InspectReport:
    from dflashkit.inspect import FileReport

    summary = {"version": 3, "arch": "dflash", "dialect": "llama.cpp", "tensor_count": 2, "size": 3 * 1024,
               "quant_mix": {"Q8_0": {"count": 1, "bytes": 34, "elements": 32, "bpw": 8.5}}, "bpw": 8.5}
    bad = Finding("x.bad", Severity.ERROR, "a.gguf: <bad> & worse", {})
    note = Finding("x.note", Severity.INFO, "a.gguf: fine", {})
    return InspectReport([FileReport("a.gguf", "gguf", summary, [note, bad]), FileReport("b", "missing", {}, [])], strict=True)


def test_text_report_through_reporting() -> None:
    text = _two_file_report().to_text()
    lines = text.splitlines()
    assert lines[:2] == ["dflash-inspect", "FAIL: 2 file(s): 1 error(s), 0 warning(s), 1 info — exit 1 (strict)"]
    assert "a.gguf: gguf v3, arch dflash, dialect llama.cpp, 2 tensors, 3.00 KiB — quant mix (1)" in lines
    assert "  Q8_0        1  34 B  8.50 bpw" in lines and "  overall 8.50 bpw" in lines
    findings = lines.index("a.gguf: gguf v3, arch dflash, dialect llama.cpp, 2 tensors, 3.00 KiB — findings (2) [!]")
    # worst first, each message exactly as found
    assert [ln.split()[0] for ln in lines[findings + 3:findings + 5]] == ["error", "info"]
    assert lines[findings + 3] == "  error     x.bad   a.gguf: <bad> & worse"
    assert "b: missing: ok: no findings" in lines


def test_markdown_html_json_renderings() -> None:
    report = _two_file_report()
    md = report.render("markdown")
    assert "| error | x.bad | a.gguf: &lt;bad&gt; &amp; worse |" in md and "**2 file(s): 1 error(s)" in md
    page = report.render("html")
    assert "a.gguf: &lt;bad&gt; &amp; worse" in page and "<bad>" not in page
    assert json.loads(report.render("json")) == report.to_dict()  # --format json is the CI document
    assert report.to_dict()["files"][0]["findings"][1]["id"] == "x.bad"
    with pytest.raises(DFlashError) as info:
        report.render("pdf")
    assert str(info.value) == "unknown report format 'pdf' (known: text, json, markdown, html)"


def test_cli_format_and_json_conflict(good: Path) -> None:
    from click.testing import CliRunner

    from dflashkit.cli import inspect_command

    r = CliRunner().invoke(inspect_command, [str(good), "--format", "markdown"])
    assert r.exit_code == 0 and r.stdout.startswith("## dflash-inspect\n")
    r = CliRunner().invoke(inspect_command, [str(good), "--json", "--format", "html"])
    assert r.exit_code == 2
    assert "--json and --format html contradict each other; pass one of them" in r.output
