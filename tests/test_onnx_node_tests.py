"""ONNX's own node tests (``onnx.backend.test``, the 1.17.0 wheel's test data) run against every backend.

This is the outside check of "the frameworks agree": ONNX's expected outputs, not ours. Every node
test of an op the importer runs is included; each case left out is listed in ``EXCLUDED`` with its
reason, and the counts per backend are asserted, so a case that starts or stops passing shows.
The node tests feed shape arguments and weights as graph inputs; the backend's rep imports them as
constants when the importer needs constants there (``multigpu.models.onnx_import.backend``).
"""

from __future__ import annotations

import re
import warnings

import pytest

import multigpu

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnx.backend.test")

from onnx.backend.test import BackendTest  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402

from multigpu.models.onnx_import.backend import onnx_backend  # noqa: E402

#: The ops whose node tests run: every run-time op of the importer.
OPS = (
    "clip", "add", "sub", "mul", "div", "pow", "matmul", "gemm", "conv", "batchnorm", "relu", "maxpool", "averagepool",
    "globalaveragepool", "flatten", "concat", "softmax", "layer_normalization", "reduce_mean", "reduce_sum", "sqrt",
    "erf", "gelu", "tanh", "sigmoid", "gather", "slice", "split", "reshape", "transpose", "squeeze", "unsqueeze",
    "dropout", "where", "cast", "identity", "expand", "shape", "size", "constant",
)  # fmt: skip
CASE = re.compile(rf"^test_({'|'.join(OPS)})(_.*)?$")

EXCLUDED: dict[str, tuple[str, ...]] = {
    "1-D, 3-D and non-square pooling windows: the protocol pools 2-D square windows": (
        "test_averagepool_1d_default",
        "test_averagepool_3d_default",
        "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False",
        "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True",
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False",
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True",
        "test_averagepool_3d_dilations_small",
        "test_maxpool_1d_default",
        "test_maxpool_3d_default",
        "test_maxpool_3d_dilations",
        "test_maxpool_3d_dilations_use_ref_impl",
        "test_maxpool_3d_dilations_use_ref_impl_large",
    ),
    "ceil_mode where it changes the output size: the protocol floors": (
        "test_averagepool_2d_ceil",
        "test_maxpool_2d_ceil",
        "test_maxpool_2d_ceil_output_size_reduce_by_one",
    ),
    "dilations: the protocol's windows are dense": (
        "test_averagepool_2d_dilations",
        "test_maxpool_2d_dilations",
    ),
    "asymmetric pads, or pads beyond kernel // 2: the protocol pads every side alike": (
        "test_averagepool_2d_pads",
        "test_averagepool_2d_pads_count_include_pad",
        "test_averagepool_2d_same_lower",
        "test_averagepool_2d_same_upper",
        "test_conv_with_strides_and_asymmetric_padding",
        "test_maxpool_2d_pads",
        "test_maxpool_2d_same_lower",
        "test_maxpool_2d_same_upper",
    ),
    "BatchNormalization in training mode: an import normalizes with running statistics; training "
    "uses the model's BatchNorm modes": (
        "test_batchnorm_epsilon_training_mode",
        "test_batchnorm_example_training_mode",
    ),
    "low-precision and string tensors (bfloat16, float8, int4, strings): the protocol has float32 and int64 only": (
        "test_cast_BFLOAT16_to_FLOAT",
        "test_cast_FLOAT16_to_FLOAT8E4M3FN",
        "test_cast_FLOAT16_to_FLOAT8E4M3FNUZ",
        "test_cast_FLOAT16_to_FLOAT8E5M2",
        "test_cast_FLOAT16_to_FLOAT8E5M2FNUZ",
        "test_cast_FLOAT16_to_INT4",
        "test_cast_FLOAT16_to_UINT4",
        "test_cast_FLOAT8E4M3FNUZ_to_FLOAT",
        "test_cast_FLOAT8E4M3FNUZ_to_FLOAT16",
        "test_cast_FLOAT8E4M3FN_to_FLOAT",
        "test_cast_FLOAT8E4M3FN_to_FLOAT16",
        "test_cast_FLOAT8E5M2FNUZ_to_FLOAT",
        "test_cast_FLOAT8E5M2FNUZ_to_FLOAT16",
        "test_cast_FLOAT8E5M2_to_FLOAT",
        "test_cast_FLOAT8E5M2_to_FLOAT16",
        "test_cast_FLOAT_to_BFLOAT16",
        "test_cast_FLOAT_to_FLOAT8E4M3FN",
        "test_cast_FLOAT_to_FLOAT8E4M3FNUZ",
        "test_cast_FLOAT_to_FLOAT8E5M2",
        "test_cast_FLOAT_to_FLOAT8E5M2FNUZ",
        "test_cast_FLOAT_to_INT4",
        "test_cast_FLOAT_to_STRING",
        "test_cast_FLOAT_to_UINT4",
        "test_cast_INT4_to_FLOAT",
        "test_cast_INT4_to_FLOAT16",
        "test_cast_INT4_to_INT8",
        "test_cast_STRING_to_FLOAT",
        "test_cast_UINT4_to_FLOAT",
        "test_cast_UINT4_to_FLOAT16",
        "test_cast_UINT4_to_UINT8",
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN",
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ",
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2",
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ",
        "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN",
        "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ",
        "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2",
        "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ",
        "test_identity_opt",
        "test_identity_sequence",
        "test_split_to_sequence_1",
        "test_split_to_sequence_2",
        "test_split_to_sequence_nokeepdims",
    ),
    "the graph computes nothing from its input (an Identity, an empty-axes reduction)": (
        "test_cast_DOUBLE_to_FLOAT",
        "test_cast_DOUBLE_to_FLOAT16",
        "test_cast_FLOAT16_to_DOUBLE",
        "test_cast_FLOAT16_to_FLOAT",
        "test_cast_FLOAT_to_DOUBLE",
        "test_cast_FLOAT_to_FLOAT16",
        "test_clip_default_inbounds_expanded",
        "test_clip_default_int8_inbounds_expanded",
        "test_constant",
        "test_identity",
        "test_reduce_sum_empty_axes_input_noop",
        "test_reduce_sum_empty_axes_input_noop_example",
    ),
    "Dropout's mask output: the core draws dropout masks, the graph does not output them": (
        "test_dropout_default_mask",
        "test_dropout_default_mask_ratio",
    ),
    "integer pooling: the protocol pools float32": ("test_maxpool_2d_uint8",),
    "MaxPool's Indices output": (
        "test_maxpool_with_argmax_2d_precomputed_pads",
        "test_maxpool_with_argmax_2d_precomputed_strides",
    ),
    "Pow with an exponent other than 0.5, 1, 2 or 3": (
        "test_pow",
        "test_pow_bcast_array",
        "test_pow_example",
        "test_pow_types_float32_int32",
        "test_pow_types_float32_int64",
        "test_pow_types_float32_uint32",
        "test_pow_types_float32_uint64",
    ),
    "Pow of an integer base: the protocol computes on float32": (
        "test_pow_types_int32_float32",
        "test_pow_types_int64_float32",
    ),
    "empty tensors: the protocol's ops refuse them": (
        "test_reduce_sum_empty_set",
        "test_reduce_sum_empty_set_non_reduced_axis_zero",
        "test_reduce_sum_square_empty_set",
        "test_reduce_sum_square_empty_set_expanded",
        "test_reshape_allowzero_reordered",
        "test_slice_start_out_of_bounds",
        "test_split_zero_size_splits_opset13",
        "test_split_zero_size_splits_opset18",
    ),
    "the output is a constant for the test's input shapes (Shape, Size, Constant): folded at "
    "import, and a Model computes from an input": (
        "test_shape",
        "test_shape_clip_end",
        "test_shape_clip_start",
        "test_shape_end_1",
        "test_shape_end_negative_1",
        "test_shape_example",
        "test_shape_start_1",
        "test_shape_start_1_end_2",
        "test_shape_start_1_end_negative_1",
        "test_shape_start_negative_1",
        "test_size",
        "test_size_example",
    ),
    "a Where between two tensors: the op set takes a Where between a tensor and a scalar (a mask)": (
        "test_where_example",
    ),
    "the test or its expansion computes with an op outside the run-time set (ReduceMax, "
    "ReduceSumSquare, Pad, GatherElements, Exp, Sum, Max, Less, sequences)": (
        "test_clip_default_max_expanded",
        "test_clip_default_min_expanded",
        "test_clip_example_expanded",
        "test_clip_expanded",
        "test_clip_inbounds_expanded",
        "test_clip_outbounds_expanded",
        "test_clip_splitbounds_expanded",
        "test_constant_pad",
        "test_constant_pad_axes",
        "test_constant_pad_negative_axes",
        "test_gather_elements_0",
        "test_gather_elements_1",
        "test_gather_elements_negative_indices",
        "test_gelu_default_1_expanded",
        "test_gelu_default_2_expanded",
        "test_gelu_tanh_1_expanded",
        "test_gelu_tanh_2_expanded",
        "test_reduce_sum_square_default_axes_keepdims_example",
        "test_reduce_sum_square_default_axes_keepdims_random",
        "test_reduce_sum_square_do_not_keepdims_example",
        "test_reduce_sum_square_do_not_keepdims_random",
        "test_reduce_sum_square_keepdims_example",
        "test_reduce_sum_square_keepdims_random",
        "test_reduce_sum_square_negative_axes_keepdims_example",
        "test_reduce_sum_square_negative_axes_keepdims_random",
        "test_relu_expanded_ver18",
        "test_softmax_axis_0_expanded",
        "test_softmax_axis_0_expanded_ver18",
        "test_softmax_axis_1_expanded",
        "test_softmax_axis_1_expanded_ver18",
        "test_softmax_axis_2_expanded",
        "test_softmax_axis_2_expanded_ver18",
        "test_softmax_default_axis_expanded",
        "test_softmax_default_axis_expanded_ver18",
        "test_softmax_example_expanded",
        "test_softmax_example_expanded_ver18",
        "test_softmax_large_number_expanded",
        "test_softmax_large_number_expanded_ver18",
        "test_softmax_negative_axis_expanded",
        "test_softmax_negative_axis_expanded_ver18",
    ),
}

#: Cases a backend fails where the others pass: a finding about that adapter, kept visible (strict xfail).
BACKEND_XFAIL: dict[str, dict[str, str]] = {
    "paddle": {
        name: "Paddle's layer_norm kernel refuses epsilon > 1e-3 (the test uses 0.1); the adapter passes it through"
        for name in (
            "test_layer_normalization_3d_axis0_epsilon",
            "test_layer_normalization_3d_axis1_epsilon",
            "test_layer_normalization_3d_axis2_epsilon",
            "test_layer_normalization_3d_axis_negative_1_epsilon",
            "test_layer_normalization_3d_axis_negative_2_epsilon",
            "test_layer_normalization_3d_axis_negative_3_epsilon",
        )
    }
}

#: The node tests of the run-time ops in the onnx 1.17.0 wheel, and how many of them pass on every backend.
INCLUDED_CASES = 398
PASSING = 241


def _cases() -> list[str]:
    return sorted(case.name for case in load_model_tests(kind="node") if CASE.match(case.name))


def _excluded() -> set[str]:
    return {name for names in EXCLUDED.values() for name in names}


def test_the_included_cases_and_their_exclusions_add_up():
    cases = _cases()
    assert len(cases) == INCLUDED_CASES
    excluded = _excluded()
    assert excluded <= set(cases), sorted(excluded - set(cases))
    assert sum(len(v) for v in EXCLUDED.values()) == len(excluded)  # each case left out once, for one reason
    assert len(cases) - len(excluded) == PASSING


def _suite(backend_name: str) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bt = BackendTest(onnx_backend(backend_name), __name__)
    for name in _cases():
        if name not in _excluded():
            bt.include(rf"^{name}_cpu$")
    for name in BACKEND_XFAIL.get(backend_name, {}):
        bt.xfail(rf"^{name}_cpu$")
    keep = {f"{name}_cpu" for name in _cases()} - {f"{name}_cpu" for name in _excluded()}
    cases = {}
    for cls_name, cls in bt.test_cases.items():
        # BackendTest makes a skipped test of every case it knows (real models, other ops): drop those
        for attr in [a for a in vars(cls) if a.startswith("test_") and a not in keep]:
            delattr(cls, attr)
        if any(a.startswith("test_") for a in vars(cls)):
            cases[cls_name] = cls
    return cases


for _backend in multigpu.available_backends():
    for _name, _case in _suite(_backend).items():
        globals()[f"{_name}_{_backend}"] = _case
del _backend, _name, _case
