"""The zoo: one speed study per timm model of a committed list, sharded and resumable, and the
leaderboard of their records (CSV in the shape of timm's results, JSON with provenance, Markdown,
a plot of x against GMACs by family).

Entry point: `run_zoo(ZooOptions)` (`quantstudy zoo`). The studies run through the sweep's
machinery (`sweep/`: one subprocess per model, its folder named from its config, a rerun skips
finished ones, local or Ray workers, host caches shared by shape).
"""
