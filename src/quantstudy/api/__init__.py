"""quantstudy as a library: the FP8 model, a study's engine and the study itself, from Python.

`quantize` (`quantize.py`), `load_engine` (`engine.py`), `run_study` and `load_study`
(`study.py`); the package root exports them lazily. Each is a thin layer over what the command
line runs, so both build the same engines and refuse the same mistakes in the same words.
"""
