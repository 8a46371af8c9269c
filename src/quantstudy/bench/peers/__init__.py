"""`quantstudy bench peers`: our FP8 engine beside torchao's float8 inference configs, one run.

On one model, the layers its recipe selects and one set of images: the fp16 engine, our FP8
engine and each torchao config that applies, every one compiled the same way, timed in the
same interleaved rounds of the study's harness and scored against fp32 on the same images;
each figure beside the ideal x of the recipe's layers (`speed/ideal.py`).

- `configs.py`: torchao's configs as peers, which recipe layers each takes, which torchao runs
  (pure: no torch, no torchao).
- `torchao.py`: a torchao engine built from the study's deployed model.
- `alike.py`: the rows file, and adding rows to a record measured in the same environment with
  the same code (one commit, or one hash of the sources that make a row's numbers).
- `run.py`: one record of rows; `phases.py`: where a row's seconds went; `table.py`: its
  Markdown table.
"""
