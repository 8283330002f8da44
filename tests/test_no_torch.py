"""The package must never import torch (the project is torch-free)."""

import subprocess
import sys


def test_import_does_not_load_torch():
    code = (
        "import sys\n"
        "import jax, jax.numpy as jnp\n"
        "import jax_sparse_attn as jsa\n"
        "from jax_sparse_attn import masks, reference, validation, hstu, bsa, demo\n"
        "cu = jnp.asarray([0, 3], jnp.int32)\n"
        "q = jnp.ones((3, 1, 4), jnp.bfloat16)\n"
        "jsa.hstu_attention(q, q, q, cu, cu, max_seqlen_q=3, max_seqlen_k=3).block_until_ready()\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


def test_torch_not_loaded_in_this_process():
    import jax_sparse_attn  # noqa: F401

    assert "torch" not in sys.modules
