"""`quantstudy bench`: product benchmarks on the prepared-study API, one JSON record each.

- `speed`: the fp16 engine against each FP8 engine (fused, scaled_mm) of a model's recipe, with
  the study's own harness; optionally the fused/unfused top-1 agreement and fp16 under
  max-autotune (`speed.py`).
- `products`: every FP8 product of several models and batches alone, every way it runs, beside
  cuBLASLt and cuBLAS, against its roofline (`products.py`); the earlier per-recipe `gemm`
  records (`GemmBench`) still load and render.
- `depthwise`: every depthwise conv alone, cuDNN fp16 against the Triton kernel with fp16 and
  FP8 input/output (`depthwise.py`).
- `kernels`: every kernel of one engine call over fresh compiles (`kernels.py`).
- `peers`: fp16, our FP8 engine and torchao's float8 configs side by side (`peers/`).
- `report DIR`: the Markdown tables of every record in a folder (`report.py`).

Each record (`schema.py`) carries its own provenance: command line, commit, GPU, driver and
versions. GPU timings need a CUDA GPU; what is meaningful on a CPU (the speed harness, marked
not meaningful; the shapes and bytes of depthwise) runs there too.
"""
