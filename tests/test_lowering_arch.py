"""The kernel backend on every supported GPU arch: selection, tiles and CPU lowering.

Lowering (CI, no GPU): CuTe DSL reads its target arch (``CUTE_DSL_ARCH``) when it is
imported, so each arch compiles in its own process (``tests/arch_lowering_worker.py``). A
representative subset of the static configurations runs per arch to keep CI in budget
(the full grid of tests/test_lowering_hstu.py / test_lowering_bsa.py runs for sm_90a; for
the others set ``JAX_SPARSE_ATTN_ARCH_GRID=full`` to lower every configuration):

* sm_80 (163 KiB): seven configurations (the worker's ``all7``): HSTU D = 64 (fp16, func
  mask), 128 (causal), 128 with a shared fp32 rab (the d rab pair reductions), 256; BSA
  D = 64, 128, 256 at both block sizes, with and without ``block_sizes`` (D = 32 lowers
  for sm_90a in tests/test_lowering_hstu.py / test_lowering_bsa.py; ``all9`` adds it);
* sm_86 (99 KiB): ``lim99``, the configurations whose tiles or support differ from sm_80's
  (HSTU D = 128 with and without rab, BSA D = 128: smaller backward tiles / one stage; HSTU
  and BSA D = 256: declined);
* sm_100a: ``bw`` (HSTU D = 128, 256; BSA D = 64 blk 128, D = 256 blk 64);
* sm_89, sm_103a, sm_120a: ``small`` (HSTU D = 128, BSA D = 64 blk 128; sm_89 and sm_120a
  share sm_86's 99 KiB limit, which ``lim99`` covers);
* sm_90a: ``hopper`` (HSTU D = 128, BSA D = 128 blk 64) with the default (Hopper) family:
  the declared shared memory of the wgmma/TMA kernels against the 227 KiB limit.

Each lowering must hold the CuTe DSL calls of the forward and the backward (BSA: also the
preprocessing; HSTU window masks: also the tile-schedule kernel) with an embedded cubin (ptxas accepted the arch), record the arch and the
portable ``sm80`` kernels in its compile keys (``vec_red`` False on sm_8x: the scalar
``red.global.add.f32`` path), and every kernel launch's declared dynamic shared memory must
fit the arch's limit and, for the portable kernels, equal the size the adapter planned its
tiles with. Configurations whose portable tiles cannot fit the arch raise
NotImplementedError naming the arch and the shared memory needed and available.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jax_sparse_attn import _platform
from jax_sparse_attn.config import Switches
from jax_sparse_attn.ffi import bsa as ffi_bsa
from jax_sparse_attn.ffi import hstu as ffi_hstu

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
FULL = os.environ.get("JAX_SPARSE_ATTN_ARCH_GRID", "") == "full"

#: arch -> (subset lowered in CI, extra Switches fields)
ARCH_RUNS = {
    "sm_80": ("all7", ()),
    "sm_86": ("lim99", ()),
    "sm_89": ("small", ()),
    "sm_100a": ("bw", ()),
    "sm_103a": ("small", ()),
    "sm_120a": ("small", ()),
    "sm_90a": ("hopper", ()),
}
#: worker configurations whose portable tiles exceed the arch's shared memory per block
#: (forward + backward of a differentiable call): BSA backward D = 256 needs at least 144 KiB
#: (one Q/dO stage), HSTU backward D = 256 at least 136 KiB
UNSUPPORTED = {"sm_86": {"h256", "b256"}}
_LIMIT_KIB = {"sm_80": 163, "sm_86": 99, "sm_89": 99, "sm_90a": 227, "sm_100a": 227,
              "sm_103a": 227, "sm_120a": 99}


def _have_cutedsl():
    try:
        import cutlass.jax  # noqa: F401, PLC0415
    except Exception:  # pragma: no cover
        return False
    return True


def _run_worker(arch, subset, extra=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_SPARSE_ATTN_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.join(TESTS, "arch_lowering_worker.py"), arch,
                           subset, *extra], capture_output=True, text=True, env=env,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _expected_smem(kernel, res, key_f, key_b):
    d = res["head_dim"]
    if kernel == "HstuFwdSm80":
        return ffi_hstu.fwd_smem_bytes(d, d, key_f["block_m"], key_f["block_n"])
    if kernel == "HstuBwdSm80":
        return ffi_hstu.bwd_smem_bytes(d, d, key_b["block_m"], key_b["block_n"])
    if kernel == "BsaFwdSm80":
        return ffi_bsa.fwd_smem_bytes(d, res["mask"])
    if kernel == "BsaBwdSm80":
        return ffi_bsa.bwd_smem_bytes(d, key_b["q_stages"])
    return None


@pytest.mark.lowering
@pytest.mark.parametrize("arch", list(ARCH_RUNS))
def test_kernels_lower_for_arch(arch):
    if not _have_cutedsl():
        pytest.skip("CuTe DSL not importable")
    subset, extra = ARCH_RUNS[arch]
    out = _run_worker(arch, "full" if FULL and arch != "sm_90a" else subset, extra)
    limit = _LIMIT_KIB[arch] * 1024
    assert out["arch"] == arch and out["limit"] == limit
    assert out["family"] == ("sm90" if arch == "sm_90a" else "portable")
    portable = arch != "sm_90a"
    unsupported = UNSUPPORTED.get(arch, set())
    assert out["results"], "the worker lowered nothing"
    for res in out["results"]:
        name = res["name"]
        if not FULL and name in unsupported:
            assert not res["ok"], f"{arch} {name}: expected NotImplementedError (shared memory)"
            err = res["error"]
            assert err.startswith("NotImplementedError") and arch in err, err
            assert "shared memory per block" in err and f"gives {_LIMIT_KIB[arch]} KiB" in err
            continue
        if FULL and not res["ok"] and "shared memory per block" in res.get("error", ""):
            continue
        assert res["ok"], f"{arch} {name}: {res.get('error')}"
        assert res["calls"] == (2 if res["op"] == "hstu" else 3), (arch, name, res["calls"])
        assert res["elf"], f"{arch} {name}: no cubin embedded"
        key_f, key_b = res["keys"]
        for key in (key_f, key_b):
            assert key["arch"] == arch
            if portable:
                assert key["impl"] == "sm80", (arch, name, key)
        assert key_b["vec_red"] == (not arch.startswith("sm_8"))
        assert res["smem"], f"{arch} {name}: no kernel launch recorded"
        for kernel, smem in res["smem"]:
            assert smem <= limit, f"{arch} {name}: {kernel} declares {smem} > {limit} bytes"
            want = _expected_smem(kernel, res, key_f, key_b)
            if want is not None:
                assert smem == want, f"{arch} {name}: {kernel} declares {smem}, planned {want}"
            if portable:
                assert kernel in ("HstuFwdSm80", "HstuBwdSm80", "BsaFwdSm80", "BsaBwdSm80",
                                  "BsaPreprocess", "HstuSchedule"), (arch, name, kernel)


# ---------------------------------------------------------------- selection (no compile)


@pytest.mark.parametrize("cc,arch", [("8.0", "sm_80"), ("8.6", "sm_86"), ("8.9", "sm_89"),
                                     ("9.0", "sm_90a"), ("10.0", "sm_100a"),
                                     ("10.3", "sm_103a"), ("12.0", "sm_120a")])
def test_arch_of_capability_and_limits(cc, arch):
    assert _platform.arch_of_capability(cc) == arch
    assert _platform.ARCHS[arch][0] == cc
    assert _platform.smem_limit(arch) == _LIMIT_KIB[arch] * 1024


@pytest.mark.parametrize("arch", list(_LIMIT_KIB))
@pytest.mark.parametrize("d", (32, 64, 128, 256))
def test_portable_tiles_fit_each_arch(arch, d):
    """The adapters' tile choice per arch: within the limit and the kernels' divisibility
    rules, or None exactly where :data:`UNSUPPORTED` says the arch cannot run it."""
    limit = _platform.smem_limit(arch)
    fwd = ffi_hstu.sm80_fwd_tiles(d, d, limit)
    bwd = ffi_hstu.sm80_bwd_tiles(d, d, limit)
    assert fwd is not None and ffi_hstu.fwd_smem_bytes(d, d, *fwd[:2]) <= limit
    if d == 256 and limit < 136 * 1024:
        assert bwd is None
    else:
        assert bwd is not None and ffi_hstu.bwd_smem_bytes(d, d, *bwd[:2]) <= limit
        assert ffi_hstu._bwd_tile_ok(d, d, *bwd)
        # the best tiles where they fit (the H200 numbers of docs/performance.md)
        if ffi_hstu.bwd_smem_bytes(d, d, 64, 128 if d <= 128 else 64) <= limit:
            assert bwd[:2] == (64, 128 if d <= 128 else 64)


@pytest.mark.parametrize("cc,kind,ok", [("7.5", "Tesla T4", False), ("8.7", "Orin", False),
                                         ("8.6", "NVIDIA A10", True), ("12.0", "RTX 5090", True)])
def test_device_reason_names_the_gpu(monkeypatch, cc, kind, ok):
    class Dev:
        platform = "gpu"
        compute_capability = cc
        device_kind = kind

    import jax  # noqa: PLC0415

    monkeypatch.delenv("CUTE_DSL_ARCH", raising=False)
    monkeypatch.setattr(jax, "devices", lambda *a: [Dev()])
    _platform._device_unavailable_reason.cache_clear()
    try:
        reason = _platform._device_unavailable_reason()
    finally:
        _platform._device_unavailable_reason.cache_clear()
    if ok:
        assert reason is None
        assert _platform.target_arch() == _platform.arch_of_capability(cc)
    else:
        assert kind in reason and cc in reason and "8.0 (sm_80)" in reason
        assert "12.0 (sm_120a)" in reason
        assert ("8.0 or later" in reason) == (cc == "7.5")


def test_unsupported_reason_names_gpu_and_smem(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_86")
    msg = ffi_bsa.bsa_kernel_unsupported_reason(dtype="bfloat16", head_dim=256, head_dim_v=256,
                                                sparse_block_size=64)
    assert "sm_86" in msg and "144 KiB" in msg and "99 KiB" in msg and "backward" in msg
    # the forward alone fits (block_sparse_attention_backward excluded)
    assert ffi_bsa.bsa_kernel_unsupported_reason(
        dtype="bfloat16", head_dim=256, head_dim_v=256, sparse_block_size=64,
        passes=("fwd",)) is None
    # D = 128: the backward with one Q/dO stage (80 KiB) instead of two (112 KiB)
    assert ffi_bsa.bsa_kernel_unsupported_reason(dtype="bfloat16", head_dim=128,
                                                 head_dim_v=128, sparse_block_size=64) is None
    assert ffi_bsa.bwd_config("bfloat16", 128, 64, False, Switches()).q_stages == 1
    assert ffi_bsa.bwd_config("bfloat16", 64, 64, False, Switches()).q_stages == 2
    msg = ffi_hstu.hstu_kernel_unsupported_reason(dtype="float16", head_dim=256, head_dim_v=256)
    assert "HSTU backward" in msg and "136 KiB" in msg and "sm_86" in msg
    assert ffi_hstu.hstu_kernel_unsupported_reason(dtype="float16", head_dim=256,
                                                   head_dim_v=256, passes=("fwd",)) is None


def test_family_switch_and_smem_limit_switch(monkeypatch):
    """kernel_family forces the portable kernels on sm_90a; smem_limit_kb selects a smaller
    arch's tiles; portable_sm8x the scalar-reduction code path; other archs are portable."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    base = Switches()
    assert _platform.kernel_family(base) == "sm90"
    assert ffi_hstu.fwd_config("bfloat16", 128, 128, 0, base).impl == "sm90ws"
    assert ffi_hstu.bwd_config("bfloat16", 128, 128, 0, base).impl == "sm90"
    assert ffi_bsa.fwd_config("bfloat16", 128, 64, False, base).impl == "sm90ws"
    port = Switches(kernel_family="portable")
    f, b = (ffi_hstu.fwd_config("bfloat16", 128, 128, 0, port),
            ffi_hstu.bwd_config("bfloat16", 128, 128, 0, port))
    assert (f.impl, b.impl, b.replaced_impl, b.vec_red) == ("sm80", "sm80", "sm90", True)
    assert (b.block_m, b.block_n, b.num_warps) == (64, 128, 8)
    assert ffi_bsa.fwd_config("bfloat16", 128, 64, False, port).impl == "sm80"
    assert ffi_bsa.bwd_config("bfloat16", 128, 64, False, port).impl == "sm80"
    sm8x = Switches(kernel_family="portable_sm8x", smem_limit_kb=99)
    b = ffi_hstu.bwd_config("bfloat16", 128, 128, 0, sm8x)
    assert (b.impl, b.block_m, b.block_n, b.num_warps, b.vec_red) == ("sm80", 32, 64, 4, False)
    assert not ffi_bsa.bwd_config("bfloat16", 64, 64, False, sm8x).vec_red
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_SMEM_LIMIT_KB"):
        Switches(smem_limit_kb=8)
    with pytest.raises(ValueError, match="JAX_SPARSE_ATTN_KERNEL_FAMILY"):
        Switches(kernel_family="sm70")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
    assert _platform.kernel_family(base) == "portable"
    assert ffi_hstu.fwd_config("bfloat16", 128, 128, 0, base).impl == "sm80"
    assert ffi_hstu.bwd_config("bfloat16", 128, 128, 0, base).vec_red


def test_which_backend_names_family_and_arch(monkeypatch):
    """The config records the family and the arch; which_backend's reason shows them."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    import jax_sparse_attn as jsa  # noqa: PLC0415
    from jax_sparse_attn import hstu as hstu_mod  # noqa: PLC0415

    if not _have_cutedsl():
        pytest.skip("CuTe DSL not importable")
    monkeypatch.setenv("JAX_SPARSE_ATTN_FORCE_KERNEL", "1")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_89")
    q = jnp.zeros((64, 2, 128), jnp.bfloat16)
    cu = jnp.array([0, 64], jnp.int32)
    choice = jsa.which_backend(jsa.hstu_attention, q, q, q, cu, cu, max_seqlen_q=64,
                               max_seqlen_k=64)
    assert choice.backend == "kernel"
    assert "'portable'" in choice.reason and "sm_89" in choice.reason
    cfg = hstu_mod._make_config(q, q, q, cu, cu, None, None, None, None, max_seqlen_q=64,
                                max_seqlen_k=64, scaling_seqlen=64.0, window_size=(-1, 0),
                                alpha=1.0, backend="kernel", switches=None,
                                op_name="hstu_attention")
    assert (cfg.kernel_arch, cfg.kernel_family) == ("sm_89", "portable")
    assert (cfg.bwd.block_m, cfg.bwd.block_n, cfg.bwd.vec_red) == (32, 64, False)
    del jax


def test_gpu_grids_take_the_family_from_the_environment(monkeypatch):
    """tests/attention_base.with_env_family: the GPU grids build Switches(...) explicitly;
    JAX_SPARSE_ATTN_KERNEL_FAMILY / SMEM_LIMIT_KB still reach them (scripts/gpu_portable.sh)."""
    sys.path.insert(0, TESTS)
    from attention_base import with_env_family  # noqa: PLC0415

    sw = Switches(hstu_fwd_impl="sm80")
    monkeypatch.delenv("JAX_SPARSE_ATTN_KERNEL_FAMILY", raising=False)
    monkeypatch.delenv("JAX_SPARSE_ATTN_SMEM_LIMIT_KB", raising=False)
    assert with_env_family(sw) is sw and with_env_family(None) is None
    monkeypatch.setenv("JAX_SPARSE_ATTN_KERNEL_FAMILY", "portable_sm8x")
    monkeypatch.setenv("JAX_SPARSE_ATTN_SMEM_LIMIT_KB", "99")
    got = with_env_family(sw)
    assert (got.kernel_family, got.smem_limit_kb, got.hstu_fwd_impl) == ("portable_sm8x", 99,
                                                                         "sm80")
