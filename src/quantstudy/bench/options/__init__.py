"""`quantstudy bench options`: what each FP8 quality option buys on one recipe's layers.

`variants.py` names the option sets, `scores.py` scores and pairs engines on the same images,
`compare.py` runs the table on a study's own preparation. docs/fp8-options.md shows the table
measured on EfficientNet-Lite0 and what it says about each option.
"""
