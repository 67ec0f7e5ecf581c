"""FlexAttention's sliding window: refused off CUDA with a clear error; on CUDA, equal to the masked reference."""

import pytest
import torch

from aiayn.nn.flex_local import flex_available, flex_local_attention
from aiayn.nn.local_attention import local_attention_reference


def test_refused_on_the_cpu_naming_the_device_and_the_alternative():
    q = torch.randn(1, 2, 8, 16)
    assert not flex_available("cpu")
    with pytest.raises(RuntimeError, match="runs on CUDA only, got device cpu.*local_attention"):
        flex_local_attention(q, q, q, window=4, causal=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's block-sparse kernel needs CUDA")
@pytest.mark.parametrize("causal", [True, False])
def test_equals_the_masked_reference_on_cuda(causal):
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda") for _ in range(3))
    expected, _ = local_attention_reference(q, k, v, window=32, causal=causal)
    torch.testing.assert_close(flex_local_attention(q, k, v, window=32, causal=causal), expected, atol=2e-3, rtol=2e-3)
