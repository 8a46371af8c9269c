"""The process environment quantstudy reads beyond its options: the lab switches, environment
variables that change what the engines compute or how they are tuned (`switches.py`), and which
GPU, torch and Triton the process runs on (`machine.py`), as every record and cache names them.

The bottom floor: the record names the switches a study ran under (`record/inputs.py:
Environment.lab_switches`) and the build spec reads them (`record/build_spec.py`), so they sit
below the record and import nothing of quantstudy.
"""
