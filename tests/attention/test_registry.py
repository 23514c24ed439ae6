"""The backend registry: every documented name is registered, optional packages are imported only
when their backend is created, and choosing one without its package names what to install."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.attention import available_backends, create_attention_backend, register_backend

ROOT = Path(__file__).resolve().parents[2]


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_available_backends_reports_what_is_importable():
    names = available_backends()
    assert names[:1] == ["torch_native"]
    assert ("triton" in names) == _importable("triton")
    assert ("flashinfer" in names) == _importable("flashinfer")
    assert ("fa3" in names) == (_importable("flash_attn_interface") or _importable("sgl_kernel"))


def test_importing_the_registry_imports_no_optional_package():
    code = ("import sys, specdec.attention as a\n"
            "a.available_backends()\n"
            "print(sorted(m for m in ('flashinfer', 'flash_attn_interface', 'sgl_kernel', 'triton', 'tvm_ffi') "
            "if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


@pytest.mark.skipif(_importable("flashinfer"), reason="flashinfer is installed here")
def test_flashinfer_without_package_names_it():
    with pytest.raises(ImportError, match="pip install flashinfer-python"):
        create_attention_backend("flashinfer")


@pytest.mark.skipif(_importable("flash_attn_interface") or _importable("sgl_kernel"), reason="an FA3 build is installed")
def test_fa3_without_package_names_it():
    with pytest.raises(ImportError, match="FlashAttention-3.*sgl-kernel"):
        create_attention_backend("fa3")


@pytest.mark.skipif(_importable("flashinfer"), reason="flashinfer is installed here")
def test_backend_modules_import_without_their_packages():
    """The backend modules hold pure-torch planning (tested on CPU); the kernels load at creation."""
    from specdec.attention import flashattention_backend, flashinfer_backend

    with pytest.raises(ImportError, match="flashinfer-python"):
        flashinfer_backend.FlashInferBackend()
    if not (_importable("flash_attn_interface") or _importable("sgl_kernel")):
        with pytest.raises(ImportError, match="flash_attn_with_kvcache"):
            flashattention_backend.FlashAttentionBackend()


def test_register_backend_with_missing_requirement(monkeypatch):
    import specdec.attention as registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # leave the real one as it was
    register_backend("_test_missing", "specdec.attention.torch_native", "TorchNativeBackend",
                     requires=("_no_such_module_a", "_no_such_module_b"), install_hint="pip install nothing")
    assert "_test_missing" not in available_backends()
    with pytest.raises(ImportError, match="'_no_such_module_a' or '_no_such_module_b'.*pip install nothing"):
        create_attention_backend("_test_missing")
    register_backend("_test_present", "specdec.attention.torch_native", "TorchNativeBackend", requires="torch")
    assert "_test_present" in available_backends()
    assert create_attention_backend("_test_present").name == "torch_native"


def test_unknown_backend_lists_registered_names():
    with pytest.raises(ValueError, match="fa3, fa4, flashinfer, torch_native, triton"):
        create_attention_backend("flash")
