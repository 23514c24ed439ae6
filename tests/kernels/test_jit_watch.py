"""JitWatch counts the Triton kernel variants built while it is open, through Triton's JIT hooks."""

import pytest
import torch

triton = pytest.importorskip("triton")
from triton import knobs  # noqa: E402

from specdec.kernels import jit_watch  # noqa: E402
from specdec.kernels.jit_watch import JitWatch  # noqa: E402


@pytest.fixture
def fresh_hooks(monkeypatch):
    """Triton's hooks as a process starts (restored after), one of them already someone else's."""
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append(("before", kw["key"])))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    monkeypatch.setattr(jit_watch, "_installed", False)
    monkeypatch.setattr(jit_watch, "_open", [])
    monkeypatch.setattr(jit_watch, "_building", {})
    return seen


class _Fn:
    module = "specdec.kernels.triton.fake"

    def __init__(self, name):
        self.name = name


def _build(key: str, name: str) -> None:
    """What Triton does for a launch that misses its in-memory cache: one hook before, one after (with
    the arguments' types and specializations: ``n`` divisible by 16)."""
    kw = dict(key=key, repr=name, fn=_Fn(name),
              compile={"signature": {"x_ptr": "*fp32", "n": "i32"}, "configs": [{(1,): [["tt.divisibility", 16]]}]})
    assert knobs.runtime.jit_cache_hook(**kw) is None  # None: go on and build it
    if knobs.runtime.jit_post_compile_hook is not None:
        knobs.runtime.jit_post_compile_hook(**kw)


def test_builds_inside_the_watch_are_counted_and_the_earlier_hook_still_runs(fresh_hooks):
    _build("k0", "before_kernel")  # not watched: Triton's own hook only
    built = []
    with JitWatch(on_build=lambda name, s: built.append(name)) as outer:
        _build("k1", "a_kernel")
        with JitWatch() as inner:
            _build("k2", "b_kernel")
    _build("k3", "after_kernel")
    names = [name for name, _ in outer.builds]
    assert names == built == [f"specdec.kernels.triton.fake.{k}(x_ptr: *fp32, n: i32 16)" for k in ("a_kernel",
                                                                                                  "b_kernel")]
    assert [name for name, _ in inner.builds] == names[1:] and inner.count == 1
    assert all(s >= 0 for _, s in outer.builds) and outer.seconds == sum(s for _, s in outer.builds)
    assert fresh_hooks == [("before", k) for k in ("k0", "k1", "k2", "k3")]  # chained, never replaced


def test_a_hook_installed_once_for_several_watches(fresh_hooks):
    with JitWatch():
        hook = knobs.runtime.jit_cache_hook
    with JitWatch() as again:
        assert knobs.runtime.jit_cache_hook is hook  # not wrapped twice
        _build("k", "kernel")
    assert again.count == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the interpreter builds nothing)")
def test_a_new_specialization_of_a_real_kernel_is_seen():
    """A kernel launched with n = 1, then n = 7 (Triton specializes integers equal to 1): two builds,
    and none for a second launch of a variant already built."""
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(16, device="cuda")
    with JitWatch() as watch:
        add_one[(1,)](x, 1, BLOCK=16)
        add_one[(1,)](x, 7, BLOCK=16)
        add_one[(1,)](x, 5, BLOCK=16)  # the variant of n = 7 (neither 1 nor a multiple of 16)
    torch.cuda.synchronize()
    assert watch.count == 2 and all("add_one(" in name for name, _ in watch.builds), watch.builds
    assert x[:1].item() == 3 and x[1:5].tolist() == [2] * 4 and x[5:7].tolist() == [1] * 2


def test_a_compile_while_serving_is_a_warning_a_cache_load_a_debug_line(caplog):
    with caplog.at_level("DEBUG", logger="specdec.kernels.jit_watch"):
        jit_watch.log_build("fast(n: i32)", 0.003)
        jit_watch.log_build("slow(n: i32 16)", 0.4)
    assert [(r.levelname, "slow" in r.message) for r in caplog.records] == [("DEBUG", False), ("WARNING", True)]
    assert "400 ms" in caplog.records[1].message
