"""``dflash-release --context … --parallel …``: the card's "By context length" table and picture and its "By
concurrent requests" table, derived from the record's per-prompt and per-batch values — and ``--check`` finds an
edited figure in the card, the record or the picture. The trained pair's τ falls past its 128-token training
length; the stand-in llama-server (×2 with a drafter) serves -np slots at once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import standin_server
from dflashkit.accept.options import ContextOptions, LlamaCppOptions, PromptOptions
from dflashkit.cli import release_command
from dflashkit.release import check_release, release
from dflashkit.release.sweeps import PICTURE, picture

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "fixtures" / "trained"
SMALL = {"prompt_options": PromptOptions(TRAINED / "prompts.jsonl", max_prompts=6, max_new_tokens=24), "parity_rounds": 2}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("swept")
    build = standin_server.make(tmp / "llama-build-a" / "bin", ms_per_token=3.0)
    target_gguf = tmp / "Qwen3-tiny-BF16.gguf"
    target_gguf.write_bytes(b"GGUF")
    out = tmp / "release"
    release(TRAINED / "drafter", out, target=TRAINED / "target", types="bf16,q4_0", workers=1,
            llama=LlamaCppOptions(llama_servers=(str(build),), target_ggufs=(str(target_gguf),), parallel=(1, 2)),
            context=ContextOptions((0, 100)), **SMALL)
    return out


def test_the_card_shows_tau_by_context_and_by_concurrency(swept: Path) -> None:
    record = json.loads((swept / "release.json").read_text())
    part = record["by_context"]
    assert part["levels"] == [0, 100] and list(part["rows"]) == ["BF16", "Q4_0"]
    assert part["source"] == "the other prompts of the set, never a prompt's own" and part["build"] == "llama-build-a"
    rows = part["rows"]["BF16"]
    assert rows[1]["prompt_tokens"] > rows[0]["prompt_tokens"] + 90 and len(rows[0]["tau_per_prompt"]) == 6
    assert rows[0]["log_speedups"] and all(abs(x - 0.69) < 0.3 for x in rows[0]["log_speedups"])
    card = (swept / "README.md").read_text()
    assert "## By context length" in card and f"![τ and speed-up by context length]({PICTURE})" in card
    bf16 = [line for line in card.splitlines() if line.startswith("| BF16 | 100 |")]
    assert len(bf16) == 1 and "%" in bf16[0]
    assert "## By concurrent requests" in card
    np2 = [line for line in card.splitlines() if line.startswith("| BF16 | 2 |")]
    assert len(np2) == 1 and np2[0].endswith("| identical |") and "0: " in np2[0] and "1: " in np2[0]
    assert "prompt tokens each on average" in card  # the main τ says what prompt length it was measured at
    png = (swept / PICTURE).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == picture(record)
    assert PICTURE in (swept / "SHA256SUMS").read_text()
    assert check_release(swept) == []


def _copy(swept: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(swept, tmp_path / "copy"))


def test_check_finds_an_edited_by_context_figure_in_the_card(swept: Path, tmp_path: Path) -> None:
    copy = _copy(swept, tmp_path)
    card = (copy / "README.md").read_text()
    line = next(ln for ln in card.splitlines() if ln.startswith("| Q4_0 | 100 |"))
    cells = line.split(" | ")
    cells[3] = f"{float(cells[3]) + 1:.2f}"  # τ one higher
    (copy / "README.md").write_text(card.replace(line, " | ".join(cells)))
    problems = check_release(copy)
    assert any(p.startswith(f"{copy / 'README.md'}:") and "the card says '| Q4_0 | 100 |" in p for p in problems)


def test_check_finds_an_edited_per_prompt_value_and_picture(swept: Path, tmp_path: Path) -> None:
    copy = _copy(swept, tmp_path)
    record = json.loads((copy / "release.json").read_text())
    record["by_context"]["rows"]["BF16"][1]["tau_per_prompt"][0] = 16.0
    (copy / "release.json").write_text(json.dumps(record, indent=2) + "\n")
    problems = check_release(copy)
    assert any("README.md" in p and "release.json gives" in p for p in problems)
    assert any(p == f"{copy / PICTURE}: not the picture release.json's by-context figures draw (edited, or of another "
               "release)" for p in problems)
    copy2 = Path(shutil.copytree(swept, tmp_path / "copy2"))
    png = bytearray((copy2 / PICTURE).read_bytes())
    png[-20] ^= 1
    (copy2 / PICTURE).write_bytes(bytes(png))
    problems = check_release(copy2)
    assert f"{copy2 / PICTURE}: not the picture release.json's by-context figures draw (edited, or of another " \
           "release)" in problems
    assert f"{copy2 / PICTURE}: does not match its line in SHA256SUMS" in problems


def test_a_context_the_prompts_cannot_hold_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(release_command, [str(TRAINED / "drafter"), str(out), "--target", str(TRAINED / "target"),
                                               "--types", "bf16", "--prompts", str(TRAINED / "prompts.jsonl"),
                                               "--max-prompts", "6", "--context", "0,160", "-q"])
    assert res.exit_code == 1, res.output
    assert res.stderr.strip() == ("error: --context 160: the other prompts hold only 146 tokens of context for prompt "
                                  "s0-0 — give --context-file FILE (long text of the target's domain)")
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--parallel", "1,2"], "--parallel starts llama-server with -np N for each level: pass --llama-server BIN_DIR"),
    (["--context-file", "x.txt"], "--context-file is the source of --context: give --context N[,N…] too"),
    (["--context", "2k,2048"], "--context 2048: given twice"),
])
def test_release_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(release_command, [str(TRAINED / "drafter"), str(tmp_path / "out"), "--target",
                                               str(TRAINED / "target"), *args, "-q"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == f"error: {message}"
    assert not (tmp_path / "out").exists()


def test_the_picture_is_a_valid_png_and_the_same_bytes_every_time() -> None:
    import struct
    import zlib

    from dflashkit.reporting.png_chart import Panel, Series, line_chart_png

    panels = [Panel("TAU", [Series("BF16", [14.0, 12.0, None]), Series("Q4_0", [13.0, float("nan"), 3.0])]),
              Panel("SPEED-UP", [Series("BF16", [2.0, 1.5, 0.8])], reference=1.0)]
    png = line_chart_png(["0", "1k", "4k"], panels, "CONTEXT")
    assert png == line_chart_png(["0", "1k", "4k"], panels, "CONTEXT")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    idat = png.index(b"IDAT")
    length = struct.unpack(">I", png[idat - 4: idat])[0]
    raw = zlib.decompress(png[idat + 4: idat + 4 + length])
    assert len(raw) == height * (1 + 3 * width)
    assert png != line_chart_png(["0", "1k", "4k"], [Panel("TAU", [Series("BF16", [14.0, 12.5, None])])], "CONTEXT")


def test_the_card_gives_tau_by_prompt_category(tmp_path: Path) -> None:
    lines = (TRAINED / "prompts.jsonl").read_text().splitlines()[:6]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({**json.loads(line), "category": "odd" if i % 2 else "even"}) + "\n"
                               for i, line in enumerate(lines)))
    out = tmp_path / "out"
    build = standin_server.make(tmp_path / "llama-build-a" / "bin", ms_per_token=3.0)  # ×2 with the drafter
    target_gguf = tmp_path / "Qwen3-tiny-BF16.gguf"
    target_gguf.write_bytes(b"GGUF")
    release(TRAINED / "drafter", out, target=TRAINED / "target", types="bf16", workers=1,
            prompt_options=PromptOptions(prompts, max_new_tokens=24), parity_rounds=2,
            llama=LlamaCppOptions(llama_servers=(str(build),), target_ggufs=(str(target_gguf),)))
    record = json.loads((out / "release.json").read_text())
    tau = record["jobs"]["BF16"]["tau"]
    assert tau["categories"] == ["even", "odd"] * 3
    card = (out / "README.md").read_text()
    rows = [line for line in card.splitlines() if line.startswith("| BF16 | even |") or line.startswith("| BF16 | odd |")]
    assert len(rows) == 2 and "## τ by prompt category" in card
    even = [x for i, x in enumerate(tau["per_prompt"]) if i % 2 == 0]
    assert rows[0].split(" | ")[3] == f"{sum(even) / 3:.2f}"
    assert all(1.5 < float(row.split(" | ")[5]) < 2.5 for row in rows)  # tok/s with the drafter over alone: ×2
    assert check_release(out) == []
    record["jobs"]["BF16"]["tau"]["categories"] = ["even"] * 5
    (out / "release.json").write_text(json.dumps(record))
    with pytest.raises(Exception, match="tau.categories: 5 for 6 prompts"):
        check_release(out)
