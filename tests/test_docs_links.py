"""Every ``benchmarks/results/...`` path the docs, the records and the code name exists.

Scanned: README.md, docs/**/*.md, the records' READMEs (and the records that are single .md files)
under benchmarks/results/, specdec/**/*.py and scripts/*. A path ends at the first character that
cannot be part of one (space, backtick, bracket, quote, comma, ``<``); trailing ``.``, ``:`` and
``;`` are sentence punctuation. A path ending in ``/`` must be a folder; one with ``*`` must match.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CITED = re.compile(r"benchmarks/results/[A-Za-z0-9_.*/+-]*")


def cited_paths(text: str) -> set[str]:
    """Worked example:

    >>> sorted(cited_paths("see `benchmarks/results/a-record/` (section 6) and benchmarks/results/b*.md."))
    ['benchmarks/results/a-record/', 'benchmarks/results/b*.md']
    """
    return {m.group(0).rstrip(".:;") for m in CITED.finditer(text)}


def _sources() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(RESULTS.rglob("README.md")),
             *sorted(RESULTS.glob("*.md")), *sorted((ROOT / "specdec").rglob("*.py")),
             *sorted(p for p in (ROOT / "scripts").iterdir() if p.is_file())]
    return list(dict.fromkeys(files))


def _exists(cited: str) -> bool:
    if "*" in cited:
        return any(ROOT.glob(cited))
    path = ROOT / cited
    return path.is_dir() if cited.endswith("/") else path.exists()


def test_cited_paths_are_extracted_as_written():
    assert cited_paths("(benchmarks/results/2026-11-26-h100-draft-fp8): x") == {
        "benchmarks/results/2026-11-26-h100-draft-fp8"}
    assert cited_paths("`git show 9378794:benchmarks/results/<path>`") == {"benchmarks/results/"}
    assert cited_paths("benchmarks/results/a/0272f8e/verify-streaming/)") == {
        "benchmarks/results/a/0272f8e/verify-streaming/"}
    assert not _exists("benchmarks/results/README.md/") and _exists("benchmarks/results/README.md")
    assert not _exists("benchmarks/results/no-such-record/")


def test_every_cited_results_path_exists():
    cited = {(path, source) for source in _sources() for path in cited_paths(source.read_text(errors="replace"))}
    assert len({path for path, _ in cited}) > 20  # the scan reads what it should
    missing = sorted(f"{path} (in {source.relative_to(ROOT)})" for path, source in cited if not _exists(path))
    assert missing == [], "cited but missing:\n" + "\n".join(missing)
