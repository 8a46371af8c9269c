"""`quantstudy package`: the study's FP8 and fp16 engines as AOTInductor packages (`.pt2`).

A study measures quantstudy's own FP8 engine; these modules turn that engine into files a user
can load with torch alone (Python `torch._inductor.aoti_load_package`, or C++
`AOTIModelPackageLoader`), with a manifest that says what they compute and what they are bound
to, and a check that runs them in a process where quantstudy cannot be imported. One module per
step: `ops` (the study's FP8 operators registered as ops AOTInductor compiles), `graph` (the
exported graph pointed at those ops), `build` (the packages, with the tiles the FP8 launchers
recorded, `quant/kernels/launches.py`), `manifest`, `loader` (a package folder's script run in
a fresh interpreter), `shipped_check` (that script, shipped beside the packages as `check.py`)
and `verify` (`--check`: the packages against the study's FP8 engine).
"""
