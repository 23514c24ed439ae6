"""The device scripts' own logic, on CPU: ``scripts/triton_cache.sh`` hands a grown Triton cache back in
parts that fit a call's returned files, and unpacks those parts (or one whole archive) on the next machine;
``scripts/gpu_ab.sh`` runs each variant over the tree and leaves the tree as it was."""

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "triton_cache.sh"
AB_SCRIPT = SCRIPT.with_name("gpu_ab.sh")


def _bash(cwd: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". {SCRIPT}\n{body}"], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env}, check=True)


@pytest.fixture
def machine(tmp_path):
    """A working tree (cwd), its $OUT, and the Triton cache directory of one 'machine'."""
    (tmp_path / "tree").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path / "tree", tmp_path / "out", {"OUT": str(tmp_path / "out"), "TRITON_CACHE_PART_MB": "1",
                                                  "TRITON_CACHE_DIR": str(tmp_path / "cache")}


def test_a_grown_cache_comes_back_in_parts_and_unpacks_whole(machine, tmp_path):
    tree, out, env = machine
    kernel = os.urandom(2_500_000)  # incompressible: three 1 MiB parts
    (tmp_path / "cache" / "ab").mkdir(parents=True)
    # the cache grows during the run (after the script was sourced), then is handed back
    (tmp_path / "k.bin").write_bytes(kernel)
    _bash(tree, f'cp {tmp_path}/k.bin "$TRITON_CACHE_DIR/ab/k.cubin"; return_triton_cache', **env)
    parts = sorted(p.name for p in out.iterdir())
    assert parts == ["triton-cache.tgz.00", "triton-cache.tgz.01", "triton-cache.tgz.02"]
    assert all((out / p).stat().st_size <= 2**20 for p in parts)
    # the next machine: the parts carried in .peer/tc, no cache yet
    (tree / ".peer" / "tc").mkdir(parents=True)
    for p in parts:
        (out / p).rename(tree / ".peer" / "tc" / p)
    fresh = dict(env, TRITON_CACHE_DIR=str(tmp_path / "cache2"))
    _bash(tree, "return_triton_cache", **fresh)  # unpacked, unchanged: nothing handed back
    assert (tmp_path / "cache2" / "ab" / "k.cubin").read_bytes() == kernel
    assert not list(out.iterdir())


def test_a_cache_that_would_not_fit_is_not_handed_back(machine, tmp_path):
    tree, out, env = machine
    for i in range(6):  # the run's own files: room for two more
        (out / f"r{i}.json").write_text("{}")
    (tmp_path / "cache").mkdir()
    (tmp_path / "k.bin").write_bytes(os.urandom(2_500_000))
    done = _bash(tree, f'cp {tmp_path}/k.bin "$TRITON_CACHE_DIR/k.cubin"; return_triton_cache', **env)
    assert "not handed back: 3 parts, room for 2" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == [f"r{i}.json" for i in range(6)]


def test_ab_runs_each_variant_over_the_tree_and_restores_it(tmp_path):
    """AB_RUN per variant: a replaced file and an added one are seen by that variant's run alone."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "kernel.py").write_text("main\n")
    variant = tmp_path / "variant" / "pkg"
    variant.mkdir(parents=True)
    (variant / "kernel.py").write_text("variant\n")
    (variant / "added.py").write_text("added\n")
    run = "cat pkg/kernel.py; ls pkg; echo > $AB_OUT/done"
    subprocess.run(["bash", str(AB_SCRIPT), "a=.", f"v={variant.parent}", "b=."], cwd=tree, check=True,
                   capture_output=True, env={**os.environ, "OUT": str(out), "AB_RUN": run})
    assert (out / "ab_a.log").read_text().split() == ["main", "kernel.py"]
    assert (out / "ab_v.log").read_text().split() == ["variant", "added.py", "kernel.py"]
    assert (out / "ab_b.log").read_text() == (out / "ab_a.log").read_text()
    assert all((out / f"ab_{name}" / "done").exists() for name in "avb")
    assert sorted(p.name for p in (tree / "pkg").iterdir()) == ["kernel.py"]
    assert (tree / "pkg" / "kernel.py").read_text() == "main\n"
