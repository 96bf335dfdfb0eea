"""The per-op cost registry on hand-computable cases (arithmetic in the comments)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from advisor.profile.costs import OpCost, attention_flops, op_cost
from advisor.profile.trace import trace_training_step


class Costs(TorchDispatchMode):
    """Collects (op name, OpCost) of every aten op run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, OpCost]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((func.overloadpacket.__name__, op_cost(func, args, kwargs or {}, out)))
        return out

    def flops(self, op: str) -> float:
        return sum(c.flops for name, c in self.calls if name == op)

    def one(self, op: str) -> OpCost:
        found = [c for name, c in self.calls if name == op]
        assert len(found) == 1, (op, [n for n, _ in self.calls])
        return found[0]


def test_mm_flops_and_bytes() -> None:
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    with Costs() as costs:
        torch.mm(a, b)
    cost = costs.one("mm")
    # mm 4x5 @ 5x6: 2*4*6*5 = 240 FLOPs
    assert cost.flops == 240 and cost.matmul
    # reads (4*5 + 5*6) * 4 bytes = 200, writes 4*6*4 = 96
    assert (cost.bytes_read, cost.bytes_written) == (200, 96)


def test_linear_is_addmm_without_bias_flops() -> None:
    layer = torch.nn.Linear(8, 16)
    with Costs() as costs:
        layer(torch.randn(32, 8))
    # addmm 32x8 @ 8x16: 2*32*16*8 = 8192 (bias add not counted, as torch's flop_counter)
    assert costs.flops("addmm") == 8192


def test_bmm() -> None:
    with Costs() as costs:
        torch.bmm(torch.randn(3, 4, 5), torch.randn(3, 5, 2))
    # bmm 3 x (4x5 @ 5x2): 2*3*4*2*5 = 240
    assert costs.one("bmm").flops == 240


@pytest.mark.parametrize(
    ("groups", "stride", "expected"),
    [
        # x [2,6,8,8], w [12,6,3,3], pad 1, stride 1 -> out [2,12,8,8]: 2*2*64*12*6*9 = 165,888
        (1, 1, 165_888),
        # stride 2 -> out [2,12,4,4]: 2*2*16*12*6*9 = 41,472
        (1, 2, 41_472),
        # groups 3: w [12,2,3,3] -> 2*2*64*12*2*9 = 55,296
        (3, 1, 55_296),
        # depthwise-like groups 6: w [12,1,3,3] -> 2*2*64*12*1*9 = 27,648
        (6, 1, 27_648),
    ],
)
def test_conv2d_groups_and_stride(groups: int, stride: int, expected: int) -> None:
    conv = torch.nn.Conv2d(6, 12, 3, stride=stride, padding=1, groups=groups, bias=False)
    with Costs() as costs:
        conv(torch.randn(2, 6, 8, 8))
    assert costs.one("convolution").flops == expected


def test_conv2d_backward_counts_input_and_weight_gradients() -> None:
    conv = torch.nn.Conv2d(6, 12, 3, padding=1, bias=False)
    x = torch.randn(2, 6, 8, 8, requires_grad=True)
    out = conv(x)
    with Costs() as costs:
        out.backward(torch.ones_like(out))
    # grad_input and grad_weight each cost one forward: 2 * 165,888
    assert costs.one("convolution_backward").flops == 2 * 165_888


def test_attention_non_causal_and_causal() -> None:
    q = torch.randn(2, 4, 16, 8)
    # QK^T and PV: 2*b*h*s*s*d twice = 2*8*16*16*(8+8) = 65,536
    assert attention_flops(q.shape, q.shape, q.shape, causal=False) == 65_536
    # causal, s_q == s_k == 16: the (16+1)/(2*16) = 17/32 of the scores at or below the diagonal
    assert attention_flops(q.shape, q.shape, q.shape, causal=True) == 65_536 * 17 / 32
    with Costs() as costs:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    sdpa = [c.flops for name, c in costs.calls if name.startswith("_scaled_dot_product")]
    assert sdpa == [65_536 * 17 / 32, 65_536]


def test_attention_backward_recomputes_the_scores() -> None:
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    with Costs() as costs:
        out.sum().backward()
    backward = [c.flops for name, c in costs.calls if name.startswith("_scaled_dot_product")]
    # forward: 8 heads x (QK^T and PV) = 8 x 2 x (2 x 16 x 16 x 8) = 65,536; backward: S again, dV, dP,
    # dQ, dK = five products of the same size = 2.5 x 65,536
    assert backward == [2.5 * 65_536]


def test_layer_norm_and_softmax() -> None:
    x = torch.randn(4, 10)
    with Costs() as costs:
        torch.nn.functional.layer_norm(x, (10,))
        torch.softmax(x, dim=-1)
    # 5 FLOPs per element on 40 elements = 200 each
    assert costs.one("native_layer_norm").flops == 200
    assert costs.one("_softmax").flops == 200


def test_pointwise_and_views() -> None:
    x = torch.randn(4, 10)
    with Costs() as costs:
        y = x.t().contiguous()
        torch.relu(y)
    # relu: one FLOP per output element = 40; reads and writes 160 bytes
    relu = costs.one("relu")
    assert (relu.flops, relu.bytes_read, relu.bytes_written) == (40, 160, 160)
    assert costs.one("t").bytes_read == 0, "a view moves no data"


def test_matmul_flops_agree_with_torch_flop_counter() -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 10)
    )
    x = torch.randn(4, 3, 16, 16)
    with FlopCounterMode(display=False) as reference:
        model(x).sum().backward()
    model.zero_grad()
    with Costs() as costs:
        model(x).sum().backward()
    ours = sum(c.flops for _, c in costs.calls if c.matmul)
    assert ours == pytest.approx(reference.get_total_flops(), rel=0.01)


def test_foreach_ops_count_the_tensors_they_update() -> None:
    params = [torch.zeros(10), torch.zeros(6)]
    grads = [torch.ones(10), torch.ones(6)]
    with Costs() as costs:
        torch._foreach_addcmul_(params, grads, grads, value=0.5)
        torch._foreach_add(params, grads)
    # in place: updates the 10 + 6 = 16 elements of its first list (not the 48 of all three lists)
    assert costs.one("_foreach_addcmul_").flops == 16
    # out of place: produces 16 elements
    assert costs.one("_foreach_add").flops == 16


def test_lstm_layers_are_counted_by_hand() -> None:
    trace = trace_training_step(lambda: torch.nn.LSTM(8, 16), lambda b: torch.randn(3, b, 8), 2, "fp32", "sgd",
                                lambda out, _: out[0].sum())
    (forward,) = [r for r in trace.records if r.op == "mkldnn_rnn_layer"]
    (backward,) = [r for r in trace.records if r.op == "mkldnn_rnn_layer_backward"]
    # w_ih 64x8 = 512, w_hh 64x16 = 1,024; 3 steps x 2 samples = 6 rows; gates G = 4 x 16 = 64
    # forward: 6 * (2 * 1,536 + 3 * 64) = 19,584; backward: 6 * (4 * 1,536 + 3 * 64) = 38,016
    assert (forward.flops, backward.flops) == (19_584, 38_016)
    assert forward.matmul and forward.gemm == (1, 6, 64, 24)
    assert trace.uncounted() == {}


def test_grouped_gemms_of_mixture_of_experts_by_hand() -> None:
    tokens, experts = torch.randn(8, 16), torch.randn(2, 16, 32)  # 8 tokens of width 16, 2 experts 16 -> 32
    offsets = torch.tensor([3, 8], dtype=torch.int32)  # expert 0 takes tokens 0-2, expert 1 tokens 3-7
    out = torch.ops.aten._grouped_mm(tokens, experts, offsets)
    cost = op_cost(torch.ops.aten._grouped_mm.default, (tokens, experts, offsets), {}, out)
    # every token through its expert's 16 x 32 matrix: 2 * 8 * 32 * 16 = 8,192 FLOPs
    assert cost.flops == 8192 and cost.matmul and cost.counted
    assert cost.gemm == (2, 4, 32, 16)  # 2 groups of 8 / 2 = 4 rows on average


class _TwoExperts(torch.nn.Module):
    """A mixture-of-experts layer as transformers runs it: every token through its expert by aten._grouped_mm."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.experts = torch.nn.Parameter(torch.randn(2, 16, 32, dtype=dtype))  # 2 experts 16 -> 32

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        offsets = torch.tensor([3, 8], dtype=torch.int32)  # expert 0 takes tokens 0-2, expert 1 tokens 3-7
        return torch._grouped_mm(tokens.to(self.experts.dtype), self.experts, offs=offsets)


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
def test_grouped_gemms_of_experts_in_fp32_trace_as_they_run(precision: str) -> None:
    """torch's meta kernel of _grouped_mm refuses fp32 operands (bf16 only on 2.13, bf16 and fp16 on 2.14) where
    its CPU and CUDA kernels run them: transformers' MoE layers call it in fp32 under fp32 and amp training."""
    trace = trace_training_step(lambda: _TwoExperts(torch.float32), lambda b: torch.randn(b, 16), 8, precision, "sgd",
                                lambda out, _: out.float().square().mean())  # a dense gradient
    grouped = [r for r in trace.records if r.op == "_grouped_mm"]
    # forward 2 * 8 * 32 * 16 = 8,192 FLOPs; backward: the experts' gradient (16 x 8 by 8 x 32, summed over each
    # expert's tokens) 2 * 16 * 32 * 8 = 8,192; the input tokens need none
    assert [r.flops for r in grouped] == [8192, 8192]
    dtype = "bfloat16" if precision == "bf16" else "float32"  # amp: transformers casts to the weights' fp32
    assert all(r.dtypes[0] == dtype for r in grouped), [r.dtypes for r in grouped]


def test_warps_bicubic_upsampling_and_index_sums_are_counted_by_hand() -> None:
    """Ops off-the-shelf models use that had no formula (RAFT's grid_sample, bicubic resizing, index_add,
    log-sigmoid, 3-D max pooling, masked_scatter, polar): every one counted."""

    class Warps(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv3d(2, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            image = torch.nn.functional.max_pool3d(self.conv(x), 2).flatten(1, 2)  # (b, 8, 4, 4)
            grid = torch.zeros(image.shape[0], 4, 4, 2)
            sampled = torch.nn.functional.grid_sample(image, grid, align_corners=False)  # (b, 8, 4, 4)
            up = torch.nn.functional.interpolate(sampled, scale_factor=2, mode="bicubic")  # (b, 8, 8, 8)
            soft = torch.nn.functional.logsigmoid(up)
            summed = torch.zeros(1, 8, 8, 8).index_add(0, torch.zeros(soft.shape[0], dtype=torch.long), soft)
            chosen = torch.zeros_like(soft).masked_scatter(soft > -1, soft)
            return summed.sum() + chosen.sum() + torch.polar(soft.abs(), soft).real.sum()

    trace = trace_training_step(Warps, lambda b: torch.randn(b, 2, 4, 8, 8), 2, "fp32", "sgd", lambda out, _: out)
    assert trace.uncounted() == {}
    flops = {(r.op, r.phase): r.flops for r in trace.records}
    # grid_sample bilinear: 8 per sampled element, 2 x 8 x 4 x 4 = 256 of them: 2,048 (backward: per gradient element)
    assert flops["grid_sampler_2d", "forward"] == flops["grid_sampler_2d_backward", "backward"] == 2048
    # bicubic: 32 per output element, 2 x 8 x 8 x 8 = 1,024: 32,768
    assert flops["upsample_bicubic2d", "forward"] == flops["upsample_bicubic2d_backward", "backward"] == 32768
    # index_add: one addition per source element (1,024); log-sigmoid and polar: one per element
    assert flops["index_add", "forward"] == flops["log_sigmoid_forward", "forward"] == flops["polar", "forward"] == 1024
    assert flops["max_pool3d_with_indices", "forward"] == 0  # data movement, counted by its bytes


def test_in_place_metadata_and_pointwise_ops_are_counted() -> None:
    """unsqueeze_ (BigBird) changes a view's metadata: free; abs_ is pointwise as abs is, though torch tags only
    abs: one FLOP per element; eye and _is_all_true (LLaVA) move data."""
    x = torch.randn(4, 6)
    assert op_cost(torch.ops.aten.unsqueeze_.default, (x.clone(), 0), {}, None) == OpCost(0.0, 0, 0, False, True)
    y = x.clone()
    cost = op_cost(torch.ops.aten.abs_.default, (y,), {}, y)
    assert cost.counted and cost.flops == 24  # 4 x 6 elements, one each
    assert op_cost(torch.ops.aten.eye.default, (3,), {}, torch.eye(3)).counted
    assert op_cost(torch.ops.aten._is_all_true.default, (x > 0,), {}, torch.tensor(True)).counted
    # Longformer's flip, RAFT's and Mask2Former's linspace: data movement; prod: one FLOP per input element (24)
    assert op_cost(torch.ops.aten.flip.default, (x, [0]), {}, x.flip(0)).counted
    assert op_cost(torch.ops.aten.linspace.default, (0.0, 1.0, 5), {}, torch.linspace(0, 1, 5)).counted
    assert op_cost(torch.ops.aten.prod.default, (x,), {}, x.prod()).flops == 24


def test_segmentation_and_mobile_ops_are_counted() -> None:
    def build() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.Hardswish(), torch.nn.Upsample(scale_factor=2,
                                   mode="bilinear"), torch.nn.Upsample(scale_factor=2, mode="nearest"))

    def loss(out: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.nll_loss(out.log_softmax(1), torch.zeros(out.shape[0], 32, 32, dtype=torch.long))

    trace = trace_training_step(build, lambda b: torch.randn(b, 3, 8, 8), 2, "fp32", "sgd", loss)
    assert trace.uncounted() == {}
    (bilinear,) = [r for r in trace.records if r.op == "upsample_bilinear2d"]
    assert bilinear.flops == 8 * 2 * 4 * 16 * 16  # 8 per output element of 2 x 4 x 16 x 16
    (hardswish,) = [r for r in trace.records if r.op.startswith("hardswish") and r.phase == "forward"]
    assert hardswish.flops == 2 * 4 * 8 * 8
