"""`quantstudy package`: the study's FP8 and fp16 engines as AOTInductor packages (`.pt2`).

A study measures quantstudy's own FP8 engine; these modules turn that engine into files a user
can load with torch alone (Python `torch._inductor.aoti_load_package`, or C++
`AOTIModelPackageLoader`), with a manifest that says what they compute and what they are bound
to, and a check that runs them in a process where quantstudy cannot be imported. One module per
step: `ops` (the FP8 kernels as ops AOTInductor compiles), `tiles` (the tiles chosen at package
time), `graph` (the exported graph pointed at those ops), `build`, `manifest`, `check`, and
`standalone` (the script the check runs, shipped beside the packages).
"""
