"""`bench_peers`: rows of our FP8 engine beside torchao's configs, one record.

Per row (one model): the study's preparation (`study.prepare.prepare_study`: model, split,
recipe resolution, calibrated plan), so every engine takes the layers a study of the same
config would select; the fp16 engine and our FP8 engine (`engines/builders.py`), and each
torchao config that applies (`torchao.py`) on the recipe's layers it takes (`configs.py`),
each refused in one line where it cannot run; all timed in one set of interleaved rounds
(`speed/harness.py: measure_speed`), each FP8 engine beside the ideal x of the recipe's layers
(`speed/ideal.py`), and each scored against the fp32 model on the held-out images
(`quality/metrics.score_engine`), at the largest timed batch so that scoring reuses the compiled
shapes. The record is written after each row, marked unfinished while rows of the command
remain, so a run cut short (or one that measures a row a command, `--max-rows`) keeps its rows
and says which are still to come. Each engine is called once at each timed batch before the
timing (its compile, a part of its own), and the row records where its seconds went
(`phases.py`), with its commit and the hash of the code that makes its numbers (`alike.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from quantstudy.bench.peers.alike import (
    ROW_SOURCES,
    check_alike,
    existing_record,
    has_row,
    with_commits,
)
from quantstudy.bench.peers.configs import Peer, device_refusal, peer_layers
from quantstudy.bench.peers.phases import RowClock
from quantstudy.bench.peers.table import phase_table, row_lines
from quantstudy.bench.peers.torchao import (
    build_torchao,
    config_text,
    conv_fp8,
    torchao_status,
    torchao_version,
)
from quantstudy.bench.provenance import CPU_REASON, collect_provenance
from quantstudy.bench.schema import (
    PeerEngine,
    PeerRefused,
    PeersBench,
    PeersResult,
    Provenance,
    RowStep,
    write_record,
)
from quantstudy.engines.builders import BuiltEngine, build_fp8, build_fp32, build_half, set_numerics
from quantstudy.engines.run import run_engine
from quantstudy.env.machine import gpu_name
from quantstudy.quality.metrics import score_engine
from quantstudy.record import EngineInfo, EngineQuality, StudyConfig
from quantstudy.record.inputs import DEFAULT_FP8_KERNEL
from quantstudy.record.vocab import FASTEST, PeerProvider
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.speed.harness import cpu_counts, measure_speed, tile_images
from quantstudy.speed.ideal import ideal_speed
from quantstudy.study.prepare import Prepared, prepare_study, study_device
from quantstudy.study.sources import engine_sources_sha256

FP16: str = EngineName.FP16  # the fp16 engine's name in a row


def bench_peers(
    configs: Sequence[StudyConfig],
    peers: Sequence[Peer],
    *,
    rounds: int,
    iters: int,
    out: Path,
    append: bool = False,
    max_rows: int | None = None,
    argv: list[str] | None = None,
    ours: Sequence[str] = (),
) -> PeersBench:
    """The record of `configs`' rows (one per model; module docstring). With `append`, the
    rows join the record at `out` (measured alike, `rows.check_alike`), skipping its rows;
    `max_rows`: measure at most that many new rows; `ours`: our engines' kernel options (default:
    the config's kernel and `fastest`, side by side)."""
    first = configs[0]
    device = study_device(first.device)
    on_gpu = device.type == "cuda"
    if on_gpu:
        set_numerics()
    status = torchao_status() if peers else None
    provenance = collect_provenance(device, argv).model_copy(update={"torchao": torchao_version()})
    timed = (rounds, iters) if on_gpu else cpu_counts(rounds, iters, 0)[:2]
    record = PeersBench(
        provenance=provenance,
        meaningful=on_gpu,
        meaningless_reason=None if on_gpu else CPU_REASON,
        batches=list(first.batches),
        rounds=timed[0],
        iters=timed[1],
        compile_mode=first.compile_mode,
        quality_batch=max(first.batches),
        results=[],
    )
    sources = engine_sources_sha256(covered=ROW_SOURCES)
    held = existing_record(out, append)
    if held is not None:
        check_alike(held, provenance, record, [(provenance.git_commit, sources)])
        record = held
    todo = [c for c in configs if not has_row(record.results, c)]
    for c in configs:
        if c not in todo:
            print(f"{c.model} ({c.weights}, {c.recipe or 'default recipe'}): already in {out}")
    todo = todo[:max_rows] if max_rows is not None else todo
    record = _marked(record, configs)
    for config in todo:
        row = peers_row(config, peers, status, provenance, rounds, iters, ours)
        row = row.model_copy(update={"engine_sources": sources})
        record = with_commits(record.model_copy(update={"results": [*record.results, row]}))
        record = _marked(record, configs)
        print("\n".join([*row_lines(record, row), "", *phase_table(row)]), flush=True)
        write_record(out, record)
    return record


def _marked(record: PeersBench, configs: Sequence[StudyConfig]) -> PeersBench:
    """`record`, marked unfinished while rows of `configs` are not in it."""
    missing = [c.model for c in configs if not has_row(record.results, c)]
    left = f"{len(missing)} of {len(configs)} rows not measured yet: {', '.join(missing)}"
    return record.model_copy(update={"unfinished": left if missing else None})


def peers_row(
    config: StudyConfig,
    peers: Sequence[Peer],
    status: str | None,
    provenance: Provenance,
    rounds: int,
    iters: int,
    ours: Sequence[str] = (),
) -> PeersResult:
    """One model's row (module docstring); `status`: `torchao_status()`."""
    start, clock = time.perf_counter(), RowClock()
    prepared = prepare_study(config, clock.prepare)
    built, layers, refused = _engines(prepared, peers, status, ours, clock)
    x = prepared.heldout_x
    print(f"timing {', '.join(built)} at batches {list(config.batches)}", flush=True)
    with clock.phase(RowStep.TIMING, detail="rounds and kernel profiles, every batch"):
        sections = measure_speed(
            built, x, list(config.batches), rounds=rounds, iters=iters,
            compile_mode=config.compile_mode,
        )  # fmt: skip
    quality = _scores(prepared, built, max(config.batches), clock)
    device = prepared.device
    gpu = gpu_name(device)
    recipe = prepared.inputs.recipe_info
    engines = []
    for name, engine in built.items():
        real, left = layers[name]
        section, missing = sections.get(name), None
        if section is not None:
            ideal, missing = ideal_speed(section, recipe, [_info(engine, left)], gpu)
            section = section.model_copy(update={"ideal": ideal})
        engines.append(
            PeerEngine(
                name=name,
                provider=_provider(name),
                built=_built_text(name, engine),
                compute_dtype=str(engine.dtype).removeprefix("torch."),
                fp8_layers=len(real),
                half_layers=left,
                speed=section,
                ideal_missing=missing,
                quality=quality[name],
            )
        )
    return PeersResult(
        model=config.model,
        weights=config.weights,
        weights_detail=prepared.model_info.weights_detail,
        recipe=prepared.inputs.recipe_source,
        selected=len(prepared.layers),
        command=provenance.command,
        images=str(config.data),
        n_calib=int(prepared.calib_x.shape[0]),
        n_images=int(x.shape[0]),
        seconds=time.perf_counter() - start,
        engines=engines,
        refused=refused,
        git_commit=provenance.git_commit,
        phases=clock.phases,
    )


Layers = tuple[list[str], dict[str, str]]  # FP8 layers; recipe layers left out -> why


def _engines(
    prepared: Prepared,
    peers: Sequence[Peer],
    status: str | None,
    ours: Sequence[str],
    clock: RowClock,
) -> tuple[dict[str, BuiltEngine], dict[str, Layers], list[PeerRefused]]:
    """fp16, ours (one engine per kernel option: by default the config's and `fastest`), and
    each torchao config that can run here, with the recipe's layers each runs in FP8; the others
    refused, each with its reason. Each engine built is called once at each timed batch."""
    config, device, model = prepared.config, prepared.device, prepared.model
    mode, fold, example = config.compile_mode, prepared.recipe.weights.fold_bn, prepared.example
    x, batches = prepared.heldout_x, config.batches
    with clock.phase(RowStep.BUILD, FP16):
        built = {FP16: build_half(model, device, example, fold=fold, compile_mode=mode)}
    _first_calls(FP16, built[FP16], x, batches, clock)
    layers: dict[str, Layers] = {FP16: ([], {})}
    default = config.fp8_kernel or DEFAULT_FP8_KERNEL
    # `fastest` times each layer's kernels on the GPU: beside the default there only
    both = (default, FASTEST) if device.type == "cuda" else (default,)
    for option in dict.fromkeys(ours or both):
        name = f"quantstudy {option}"
        with clock.phase(RowStep.BUILD, name):
            ours_engine = build_fp8(
                model, device, example, prepared.plan, fold=fold, compile_mode=mode,
                spec=config.replace(fp8_kernel=option).build_spec(),
            )  # fmt: skip
        _first_calls(name, ours_engine, x, batches, clock)
        built[name] = ours_engine
        layers[name] = (list(ours_engine.applied.real), dict(ours_engine.applied.emulated))
    refused = []
    if status is not None and peers:  # torchao absent or unusable: one line for all its configs
        print(f"torchao: refused: {status}", flush=True)
        return built, layers, [PeerRefused(name="torchao", reason=status)]
    selected = prepared.inputs.recipe_info.selected
    conv = conv_fp8(device)
    for peer in peers:
        reason = device_refusal(peer, device.type)
        taken, left = peer_layers(peer, selected, conv)
        if reason is None and not taken:
            reason = f"takes none of the recipe's {len(selected)} layers: " + "; ".join(
                sorted(set(left.values()))
            )
        if reason is not None:
            print(f"{peer.label}: refused: {reason}", flush=True)
            refused.append(PeerRefused(name=peer.label, reason=reason))
            continue
        engine, failure = _built_and_run(prepared, peer, taken, clock)
        if engine is None:
            print(f"{peer.label}: failed: {failure}", flush=True)
            refused.append(PeerRefused(name=peer.label, reason=f"failed here: {failure}"))
            continue
        left |= {n: "torchao left it as it is" for n in taken if n not in engine.applied.real}
        built[peer.label] = engine
        layers[peer.label] = (list(engine.applied.real), left)
    return built, layers, refused


def _first_calls(
    name: str, engine: BuiltEngine, x: torch.Tensor, batches: Sequence[int], clock: RowClock
) -> None:
    """Call `engine` once at each timed batch: it compiles there (and our kernels tune), on the
    shapes the timing's warm-up would compile, so the compile is a part of its own."""
    with torch.no_grad():
        for batch in batches:
            with clock.phase(RowStep.COMPILE, name, batch):
                engine.module(engine.prepare(tile_images(x, batch)))
                if engine.device.type == "cuda":
                    torch.cuda.synchronize(engine.device)


def _built_and_run(
    prepared: Prepared, peer: Peer, layers: list[str], clock: RowClock | None = None
) -> tuple[BuiltEngine | None, str | None]:
    """The torchao engine, called once at each timed batch (`_first_calls`), or None and the
    first error. A peer library failing on a model is a finding of the benchmark, recorded in
    one line, and the other engines are timed all the same; our own engines are not guarded so
    (a failure there is a bug)."""
    clock = clock or RowClock(echo=None)
    try:
        with clock.phase(RowStep.BUILD, peer.label):
            engine = build_torchao(prepared, peer, layers)
        _first_calls(peer.label, engine, prepared.heldout_x, prepared.config.batches, clock)
    except Exception as err:  # torchao's and Inductor's errors have no common base
        text = str(err).strip().splitlines()
        return None, f"{type(err).__name__}: {text[0] if text else ''}"
    return engine, None


def _scores(
    prepared: Prepared, engines: dict[str, BuiltEngine], batch: int, clock: RowClock
) -> dict[str, EngineQuality]:
    """Each engine against the fp32 model on the held-out images, in batches of `batch` (the
    last padded: the compiled shapes of the timing are reused)."""
    x, labels, seed = prepared.heldout_x, prepared.labels, prepared.config.seed
    with clock.phase(RowStep.QUALITY, EngineName.FP32.value, batch):
        fp32 = build_fp32(prepared.model, prepared.device)
        ref = run_engine(fp32, x, batch, pad=True)
        del fp32
    scores = {}
    for name, engine in engines.items():
        with clock.phase(RowStep.QUALITY, name, batch):
            out = run_engine(engine, x, batch, pad=True)
            scores[name] = score_engine(name, ref, out, labels, seed=seed)
    return scores


def _info(engine: BuiltEngine, left: dict[str, str]) -> EngineInfo:
    """The engine's description for its ideal: the recipe's layers it leaves out count as
    emulated ones (their products stay in its fp16 group, `speed/ideal.py`), so every engine's
    ideal is that of the recipe's layers, and its fraction of it reads alike."""
    info = engine.info()
    emulated = [*info.fp8_emulated, *(n for n in left if n not in info.fp8_emulated)]
    return info.model_copy(update={"fp8_emulated": emulated})


def _provider(name: str) -> PeerProvider:
    if name == FP16:
        return PeerProvider.FP16
    return PeerProvider.QUANTSTUDY if name.startswith("quantstudy") else PeerProvider.TORCHAO


def _built_text(name: str, engine: BuiltEngine) -> str:
    compiled = f"torch.compile ({engine.compile_mode})" if engine.compiled else "eager (CPU)"
    if name == FP16:
        return f"engines.builders.build_half: BatchNorm folded, channels-last, {compiled}"
    if name.startswith("quantstudy"):
        return (
            f"engines.builders.build_fp8 ({engine.layout.kernel_option} kernel) on the recipe's "
            f"calibrated plan, channels-last, {compiled}"
        )
    peer = next(p for p in Peer if p.label == name)
    return f"{config_text(peer)}, channels-last, {compiled}"
