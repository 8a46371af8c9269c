"""The TensorRT bridge: the study's exact FP8 recipe out as a Q/DQ ONNX, trtexec's timings back in.

TensorRT is not a dependency: `export` writes an explicitly quantized ONNX and the `trtexec`
command lines that build and time it, `check` proves the ONNX's numerics on onnxruntime against
the study's own fake-quant engine, and `import-trt` reads trtexec's exported JSON into a copy of
the study whose speed section is TensorRT's. Needs the optional extra `[onnx]`.
"""
