"""A kernel's name in a finding's text (kernelnames.display_kernel_name): demangled C++
signatures of PyTorch's own kernels run to kilobytes; the sentence shows the kernel's head and
the JSON's metrics keep the whole name."""
from pathlib import Path

import pytest

from navdoctor.kernelnames import DISPLAY_NAME_CHARS, display_kernel_name
from navdoctor.rules import Rule, render_message

ACCESSOR = ("torch::headeronly::detail::GenericPackedTensorAccessor<torch::headeronly::detail::"
            "TensorAccessor<c10::ArrayRef<long>, const T1, (unsigned long)3>, int>, ")
DEPTHWISE = ("void at::native::<unnamed>::conv_depthwise2d_grad_weight_kernel<float, unsigned int>("
             + ACCESSOR * 3 + "int, int, int)")


def test_long_signature_keeps_its_head_and_own_template_arguments():
    shown = display_kernel_name(DEPTHWISE)
    assert shown == "at::native::{anonymous}::conv_depthwise2d_grad_weight_kernel<float, unsigned int>"
    assert len(shown) <= DISPLAY_NAME_CHARS


def test_short_names_are_left_alone():
    for name in ("ampere_sgemm_128x64_tn",
                 "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)"):
        assert display_kernel_name(name) == name


def test_template_arguments_too_long_give_the_family():
    functor = "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >"
    name = (f"void at::native::vectorized_elementwise_kernel<4, {functor}, std::array<char*, 3ul> >"
            f"(int, {functor}, std::array<char*, 3ul>)")
    assert display_kernel_name(name) == "at::native::vectorized_elementwise_kernel"
    assert display_kernel_name("k" * 150 + "<int>(int)").endswith("\u2026")
    assert len(display_kernel_name("k" * 150 + "<int>(int)")) == DISPLAY_NAME_CHARS


def test_message_shows_the_head_and_leaves_other_text_alone():
    rule = Rule.model_validate({
        "id": "t", "title": "t", "category": "compute", "severity": "low",
        "query": "SELECT 1", "condition": "true",
        "message": "costliest {top_kernel}; loop {loop_body}"})
    loop = "aten::mul, aten::add_, " * 10
    text = render_message(rule, {"top_kernel": DEPTHWISE, "loop_body": loop})
    assert "conv_depthwise2d_grad_weight_kernel<float, unsigned int>;" in text
    assert "GenericPackedTensorAccessor" not in text
    assert loop in text


MIXED = Path(__file__).resolve().parent.parent / "fixtures" / "gpu" / "mixed"


def test_a_real_capture_s_compute_finding_reads_short():
    """EfficientNet-B0's costliest kernel on an H100 is the depthwise convolution's backward
    (1.5 KB demangled); the finding names it in one line, the metrics keep it whole."""
    from navdoctor.analysis import analyze
    from navdoctor.rules import load_rules
    capture = MIXED / "h100r15_effnetb0_launch_0.25.nsys.sqlite.gz"
    if not capture.exists():
        pytest.skip("capture not in this checkout")
    finding = next(f for f in analyze([str(capture)], load_rules()).findings
                   if f.rule.id == "compute-gpu-bound")
    assert "GenericPackedTensorAccessor" in finding.metrics["top_kernel"]
    assert "GenericPackedTensorAccessor" not in finding.message
    assert "conv_depthwise2d_grad_weight_kernel" in finding.message


def test_op_sequences_with_brackets_are_not_shortened():
    """Only kernel-named metrics are shortened: an op sequence may hold '<built-in method ...>'."""
    rule = Rule.model_validate({
        "id": "t", "title": "t", "category": "launch", "severity": "low",
        "query": "SELECT 1", "condition": "true", "message": "loop ({loop_body})"})
    loop = "aten::select, <built-in method item of Tensor object>, aten::mul, " * 3
    assert render_message(rule, {"loop_body": loop}) == f"loop ({loop})"


def test_the_kernel_s_own_template_arguments_not_its_namespace_s():
    name = "void at::native::reduce::reduce<float, 4>(" + "int, " * 40 + "int)"
    assert display_kernel_name(name) == "at::native::reduce::reduce<float, 4>"


def test_cudnn_s_own_cutlass_copy_is_named_by_its_kernel():
    from navdoctor.kernelnames import kernel_family
    name = ("void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::conv::kernel::ImplicitGemmConvolution<"
            + "int, " * 40 + "int>>(Params)")
    assert kernel_family(name) == "cutlass__5x_cudnn::conv::kernel::ImplicitGemmConvolution"


def test_compare_text_cuts_long_names_with_an_ellipsis():
    """`compare`'s text lists the kernels and operators that changed most: a long name is cut
    with an ellipsis (it was cut at 90 characters with no mark that it was)."""
    from navdoctor.compare import ChangeOut, CompareReport, SideOut, StepTimeOut, render_text
    side = SideOut(captures=[], bound="compute", step_ms=10.0, shares={}, buckets_ms={})
    long_family = "at::native::" + "very_long_kernel_family_name_" * 5
    op = "aten::" + "x" * 120
    r = CompareReport(
        step_time=StepTimeOut(result="faster", detail="", speedup=1.2, ci=[1.1, 1.3],
                              slowdown_ci=[-0.2, -0.1], margin=0.05, before_ms=12.0, after_ms=10.0,
                              comparable=True),
        class_change={"before": "compute", "after": "compute"}, before=side, after=side,
        buckets=[], findings={"appeared": [], "disappeared": [], "both": []},
        kernels=[ChangeOut(name=long_family, before_ms=2.0, after_ms=1.0, delta_ms=-1.0),
                 ChangeOut(name="ampere_sgemm_128x64_tn", before_ms=1.0, after_ms=0.5, delta_ms=-0.5)],
        operators=[ChangeOut(name=op, before_ms=2.0, after_ms=1.0, delta_ms=-1.0)], notes=[])
    text = render_text(r)
    lines = {ln.split()[-1] for ln in text.splitlines() if "->" in ln and "ms/step" not in ln}
    assert long_family[:89] + "\u2026" in lines and op[:89] + "\u2026" in lines
    assert "ampere_sgemm_128x64_tn" in lines


def test_html_kernel_table_shows_the_head_and_keeps_the_whole_name_in_its_tooltip():
    from navdoctor.reporters.html import _kernels_html
    row = {"name": DEPTHWISE, "total_ns": 2e6, "calls": 4, "mean_ns": 5e5, "tensor_cores": False,
           "occupancy": None, "communication": False}
    page = _kernels_html({"rows": [row], "total_ns": 2e6, "steps": 2, "trace_id": 1, "distinct": 1},
                         "nsys")
    import html
    cell = page.split('<td class="name"', 1)[1].split("</td>", 1)[0]
    title, shown = cell.split('title="', 1)[1].split('">', 1)
    assert html.unescape(title) == DEPTHWISE
    assert html.unescape(shown) == display_kernel_name(DEPTHWISE, 200)
    assert len(html.unescape(shown)) < len(DEPTHWISE)


def test_html_operator_table_cuts_a_long_name_with_an_ellipsis_and_keeps_it_whole_in_its_tooltip():
    from navdoctor.reporters.html import _ops_html
    long_op = 'aten::<lambda>"q"' + "_very_long_operator_name" * 12   # escaped in both places
    page = _ops_html({"rows": [{"name": long_op, "total_ns": 1e6, "calls": 2, "mean_ns": 5e5}],
                      "trace_id": 1}, "kineto")
    import html
    cell = page.split('<td class="name"', 1)[1].split("</td>", 1)[0]
    title, shown = cell.split('title="', 1)[1].split('">', 1)
    assert html.unescape(title) == long_op
    assert html.unescape(shown) == long_op[:199] + "\u2026"
