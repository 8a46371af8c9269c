"""Kernel grouping on profiler kernel names, and the per-group summary of one call.

The names follow what cuBLAS/cuBLASLt, cuDNN, CUTLASS, PyTorch's own CUDA kernels and Inductor
show in torch.profiler / Nsight traces; long template argument lists are shortened ("...").
"""

import pytest

from quantstudy.record import KernelGroupTime
from quantstudy.record.vocab import KernelGroup
from quantstudy.speed.kernels import (
    GROUPS,
    TOP_KERNELS,
    group_kernel,
    kernels_from_trace,
    summarize_kernels,
)

NAMES = [
    # cuBLAS(Lt) GEMMs. nvjet type codes: qq = FP8 operands, h = fp16, t = bf16.
    ("nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT", "fp8_matmul"),
    ("nvjet_qqtst_112x128_128x7_2x1_v_bz_coopA_algo2_TNN", "fp8_matmul"),
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", "fp16_matmul_conv"),
    ("nvjet_tst_128x128_64x4_1x2_h_bz_coopA", "fp16_matmul_conv"),
    (
        "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_cgasize1x2x1_stage4"
        "_gmmastage2_warpgroupsize1x1x1_tensor64x128x32",
        "fp8_matmul",
    ),
    ("sm90_xmma_gemm_e4m3f32_e4m3f32_f32_tn_n_tilesize128x128x128", "fp8_matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn", "fp16_matmul_conv"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "fp16_matmul_conv"),
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x3_nn_align8>"
        "(cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x3_nn_align8::Params)",
        "fp16_matmul_conv",
    ),
    (
        "void gemv2T_kernel_val<int, int, __half, __half, float, 128, 16, 4, 4, false, false, ...>"
        "(...)",
        "fp16_matmul_conv",
    ),
    # CUTLASS FP8 GEMM as used by torch._scaled_mm with row-wise scales (shortened).
    (
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, "
        "int>, cutlass::gemm::collective::CollectiveMma<..., cutlass::float_e4m3_t, ...> > >(...)",
        "fp8_matmul",
    ),
    # cuDNN convolutions.
    (
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64"
        "_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn",
        "fp16_matmul_conv",
    ),
    (
        "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>"
        "(int, int, int, float const*, int, float*, ...)",
        "fp16_matmul_conv",
    ),
    (
        "void cudnn::cnn::conv2d_grouped_direct_kernel<(bool)0, (bool)1, (bool)0, (bool)0, "
        "(bool)0, (bool)0, int, __half, __half, ...>(...)",
        "depthwise_conv",
    ),
    ("conv2d_c1_k1_nhwc_specialized", "depthwise_conv"),  # as the H200's profiler names it
    (
        "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<3, c10::Half, "
        "int>(at::GenericPackedTensorAccessor<c10::Half const, 4ul, at::DefaultPtrTraits, int>, "
        "...)",
        "depthwise_conv",
    ),
    (
        "void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true, "
        "(cudnnKernelDataType_t)0>(cudnn::ops::nchw2nhwc_params_t<float>, __half const*, "
        "__half*)",
        "other",
    ),
    # Attention.
    (
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel"
        "<cutlass::half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "fp16_matmul_conv",
    ),
    # Inductor kernels (default "original_aten" names: sorted aten ops).
    ("triton_tem_fused__scaled_mm_0", "fp8_matmul"),
    ("triton_tem_fused_mm_1", "fp16_matmul_conv"),
    ("triton_tem_fused_addmm_relu_2", "fp16_matmul_conv"),
    ("triton_tem_fused_convolution_3", "fp16_matmul_conv"),
    ("triton_poi_fused__to_copy_clamp_div_0", "quantize_convert"),
    ("triton_poi_fused__to_copy_add_clamp_div_hardswish_4", "quantize_convert"),
    ("triton_red_fused_abs_amax_5", "quantize_convert"),
    # the fused FP8 layer's input quantize, named after the custom op that reads it (H200 run 9)
    ("triton_poi_fused__to_copy_clamp_div_fp8_gemm_6", "quantize_convert"),
    ("_fp8_gemm_kernel", "fp8_matmul"),
    ("triton_poi_fused__to_copy_6", "other"),
    ("triton_poi_fused_convolution_hardswish_7", "other"),
    ("triton_poi_fused_addmm_relu_8", "other"),
    ("triton_poi_fused__scaled_dot_product_efficient_attention_9", "other"),
    ("triton_per_fused__softmax_10", "other"),
    ("triton_red_fused_mean_11", "other"),
    # PyTorch eager elementwise kernels.
    (
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::float8_copy_kernel_cuda"
        "(at::TensorIteratorBase &)::[lambda(float) (instance 1)], std::array<char *, "
        "(unsigned long)2>>(int, T2, T3)",
        "quantize_convert",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>,"
        " std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::Half>, "
        "std::array<char*, 3ul>)",
        "other",
    ),
    (
        "void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, __nv_bfloat16, float, "
        "__nv_bfloat16, (bool)0, ...>(...)",
        "other",
    ),
]


@pytest.mark.parametrize(("name", "group"), NAMES)
def test_group_kernel(name, group):
    assert group_kernel(name) == group


def test_every_group_is_reached_by_the_examples():
    assert {group for _, group in NAMES} == set(GROUPS)


def test_groups_are_the_schema_vocabulary():
    assert KernelGroupTime.model_fields["group"].annotation is KernelGroup
    assert GROUPS == tuple(KernelGroup)


def test_grouping_ignores_case():
    assert group_kernel("NVJET_QQTST_128x256") == "fp8_matmul"
    assert group_kernel("Conv_DepthWise2d_forward") == "depthwise_conv"


def test_kernels_from_trace_keeps_only_kernel_events():
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "nvjet_hsh_1", "dur": 12.5},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "dur": 40.0},
            {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 1.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 5.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 20.0},
            {"ph": "X", "cat": "Kernel", "name": "triton_poi_fused_add_0", "dur": 2.0},
            {"ph": "s", "cat": "ac2g", "name": "flow"},
        ]
    }
    assert kernels_from_trace(trace) == [("nvjet_hsh_1", 12.5), ("triton_poi_fused_add_0", 2.0)]


def test_summarize_kernels_sums_per_group_and_lists_all_groups():
    kernels = [
        ("nvjet_qqtst_a", 10.0),
        ("nvjet_qqtst_a", 6.0),
        ("triton_poi_fused__to_copy_clamp_div_0", 3.0),
        ("nvjet_hsh_b", 7.0),
        ("triton_poi_fused_add_1", 1.5),
    ]
    b = summarize_kernels("fp8", 32, kernels)
    assert (b.engine, b.batch, b.kernel_count) == ("fp8", 32, 5)
    assert b.total_us == pytest.approx(27.5)
    by_group = {g.group: (g.time_us, g.count) for g in b.groups}
    assert [g.group for g in b.groups] == list(GROUPS)
    assert by_group == {
        "fp8_matmul": (16.0, 2),
        "fp16_matmul_conv": (7.0, 1),
        "depthwise_conv": (0.0, 0),
        "quantize_convert": (3.0, 1),
        "other": (1.5, 1),
    }
    assert sum(t for t, _ in by_group.values()) == pytest.approx(b.total_us)
    # Same-name kernels are summed; largest first.
    assert b.top_kernels[0] == ("nvjet_qqtst_a", 16.0)
    assert [name for name, _ in b.top_kernels] == [
        "nvjet_qqtst_a",
        "nvjet_hsh_b",
        "triton_poi_fused__to_copy_clamp_div_0",
        "triton_poi_fused_add_1",
    ]


def test_top_kernels_are_capped():
    kernels = [(f"triton_poi_fused_add_{i}", float(i)) for i in range(TOP_KERNELS + 5)]
    b = summarize_kernels("fp16", 1, kernels)
    assert len(b.top_kernels) == TOP_KERNELS
    assert b.top_kernels[0] == (f"triton_poi_fused_add_{TOP_KERNELS + 4}", float(TOP_KERNELS + 4))
