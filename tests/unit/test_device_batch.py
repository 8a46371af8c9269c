"""tools/device/batch.py: many GPU jobs in one device call. Jobs here are shell commands that
sleep briefly and write into $OUT, on fake GPUs (`--gpus N`, no nvidia-smi needed): the order
and overlap they ran in, a job stopped at the budget with its whole process group, `after`,
jobs the budget leaves out, batch.json as jobs end, and the pack and its way back."""

import importlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from _tools import TOOLS, load_tool

pytestmark = pytest.mark.committed("tools/device/batch.py")
BATCH = load_tool("device/batch.py")
# the modules batch.py imports (its folder is on sys.path now), not second copies of them
PACK = importlib.import_module("batch_pack")
RUNNER = importlib.import_module("batch_runner")
JOB = 'sleep {s}; echo "$CUDA_VISIBLE_DEVICES" > $OUT/gpu.txt'


@pytest.fixture(autouse=True)
def _no_real_gpus(monkeypatch):
    """The in-process runs take fake GPUs even where nvidia-smi lists real ones (the GPU
    machine's one H100 refuses `--gpus 4`, rightly: test_gpus_beyond_the_hosts_are_refused
    holds that); `_start`'s runner, a process of its own, asks for one GPU only."""
    monkeypatch.setattr(BATCH, "host_gpus", lambda: [])


def _run(tmp_path: Path, jobs: list[dict], *options: str) -> tuple[int, dict]:
    """Run `jobs` (written as the jobs file) in `tmp_path`; the exit status and batch.json."""
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(jobs))
    out, work = tmp_path / "out", tmp_path / "work"
    status = BATCH.main([str(path), "--out", str(out), "--work", str(work), *options])
    return status, json.loads((out / "batch.json").read_text())


def _start(tmp_path: Path, jobs: list[dict], *options: str) -> subprocess.Popen:
    """The runner on `jobs` in a process of its own (a test that kills or signals it), on one
    GPU, as `_run` lays out its folders."""
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump(jobs))
    command = [sys.executable, str(TOOLS / "device" / "batch.py"), str(tmp_path / "jobs.yaml")]
    command += ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--gpus", "1"]
    return subprocess.Popen([*command, *options], stdout=subprocess.DEVNULL)


def _wait_until(ready, what: str, seconds: float = 60.0) -> None:
    """Poll `ready` until it holds; fail naming `what` after `seconds`. Generous: the runner is
    a fresh Python process, and on a loaded 2-core CI machine its start took over 10 s."""
    end = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < end, f"{what} not within {seconds:.0f} s"
        time.sleep(0.05)


def _jobs(record: dict) -> dict[str, dict]:
    return {j["name"]: j for j in record["jobs"]}


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (killed, waiting for its parent to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_one_gpu_runs_the_jobs_in_turn_in_the_files_order(tmp_path):
    jobs = [{"name": n, "run": JOB.format(s=0.1), "minutes": m} for n, m in
            (("first", 0.01), ("longest", 0.05), ("last", 0.02))]  # fmt: skip
    status, record = _run(tmp_path, jobs, "--gpus", "1")
    assert status == 0 and record["finished"]
    ran = _jobs(record)
    assert [j["status"] for j in ran.values()] == ["ok"] * 3
    starts = [ran[n]["start_s"] for n in ("first", "longest", "last")]
    assert starts == sorted(starts)  # the file's order, not the longest first
    assert all(j["co_runners"] == [] for j in ran.values())  # none overlapped another
    assert {j["gpu"] for j in ran.values()} == {"0"}


# Each job says it started, then waits (at most a minute) until four have: run side by side, the
# first four overlap however slowly a loaded machine starts them; run in turn, the first waits
# out its minute alone and overlaps none.
SIDE_BY_SIDE = (
    'touch "$BATCH_JOBS/../started-$BATCH_JOB"; '
    'for i in $(seq 600); do [ $(ls "$BATCH_JOBS"/../started-* | wc -l) -ge 4 ] && break; '
    'sleep 0.1; done; echo "$CUDA_VISIBLE_DEVICES" > $OUT/gpu.txt'
)


def test_four_gpus_run_side_by_side_longest_first(tmp_path):
    minutes = {"a": 0.01, "b": 0.05, "c": 0.04, "d": 0.03, "e": 0.02, "f": 0.06}
    jobs = [{"name": n, "run": SIDE_BY_SIDE, "minutes": m} for n, m in minutes.items()]
    status, record = _run(tmp_path, jobs, "--gpus", "4")
    assert status == 0
    ran = _jobs(record)
    first = sorted(ran, key=lambda n: ran[n]["start_s"])[:4]
    assert set(first) == {"f", "b", "c", "d"}  # the four longest expected
    assert {ran[n]["gpu"] for n in first} == {"0", "1", "2", "3"}
    assert set(ran["f"]["co_runners"]) >= {"b", "c", "d"}  # not one after another
    back = tmp_path / "back"
    BATCH.main(["unpack", *[str(tmp_path / "out" / f) for f in record["packed"]], "--into",
                str(back)])  # fmt: skip
    for name, job in ran.items():  # each job saw the GPU batch.json says it had
        assert (back / name / "gpu.txt").read_text().strip() == job["gpu"]


def test_a_job_past_the_budget_is_stopped_with_its_process_group(tmp_path):
    # the background sleep ignores Ctrl-C (a non-interactive shell's background job does), so
    # only the kill of the whole group after the grace period ends it
    run = "sleep 60 & echo $! > $OUT/child.pid; wait"
    jobs = [{"name": "hangs", "run": run, "minutes": 0.01}]
    status, record = _run(tmp_path, jobs, "--gpus", "1", "--budget", "1", "--grace", "0.3")
    job = _jobs(record)["hangs"]
    assert status == 1 and job["status"] == "stopped" and job["exit"] != 0
    assert "budget" in job["why"]
    # stopped at the budget, which counts from the batch's start (a loaded machine starts the
    # job late), and killed after the grace period, not ended by its 60 s sleep: the upper
    # bound leaves a loaded machine's polling tens of seconds of room; 0.1 s: the rounding
    assert job["start_s"] + job["wall_s"] >= 1 - 0.1 and job["wall_s"] < 30
    child = int((tmp_path / "work" / "jobs" / "hangs" / "child.pid").read_text())
    # killed with its group; a SIGKILLed process takes a moment to exit on a loaded machine,
    # far less than the 20 s here, and its own sleep would end only at 60 s
    _wait_until(lambda: not _alive(child), "the job's background child gone", seconds=20)


def test_after_waits_for_the_jobs_it_names_and_reads_their_output(tmp_path):
    jobs = [
        {"name": "shard-1", "run": "sleep 0.3; echo one > $OUT/rows", "minutes": 0.02},
        {"name": "shard-2", "run": "sleep 0.1; echo two > $OUT/rows", "minutes": 0.01},
        {"name": "board", "run": "cat $BATCH_JOBS/shard-*/rows > $OUT/board", "minutes": 0.05,
         "after": ["shard-1", "shard-2"]},
        {"name": "other", "run": "sleep 0.1", "minutes": 0.01},
    ]  # fmt: skip
    status, record = _run(tmp_path, jobs, "--gpus", "3")
    ran = _jobs(record)
    assert status == 0
    # the longest expected, yet it ran after both and beside neither
    assert ran["board"]["start_s"] >= ran["shard-1"]["start_s"]
    assert not {"shard-1", "shard-2"} & set(ran["board"]["co_runners"])
    board = tmp_path / "work" / "jobs" / "board" / "board"
    assert board.read_text().split() == ["one", "two"]


def test_a_job_that_cannot_end_within_the_budget_is_not_run(tmp_path):
    jobs = [
        {"name": "fits", "run": JOB.format(s=0), "minutes": 0.01},
        {"name": "too-long", "run": "touch $OUT/ran", "minutes": 2},
        {"name": "waits", "run": "touch $OUT/ran", "minutes": 0.01, "after": ["too-long"]},
        {"name": "board", "run": "touch $OUT/ran", "minutes": 0.01,
         "after": ["fits", "too-long"]},
    ]  # fmt: skip
    status, record = _run(tmp_path, jobs, "--gpus", "1", "--budget", "60")
    ran = _jobs(record)
    assert status == 1
    assert ran["too-long"]["status"] == "not_run" and ran["too-long"]["start_s"] is None
    assert "expected 2 min" in ran["too-long"]["why"]
    assert ran["board"]["status"] == "ok"  # `after`: once they ended, however they ended
    assert ran["waits"]["status"] == "not_run" and "none of the jobs" in ran["waits"]["why"]
    assert not (tmp_path / "work" / "jobs" / "too-long").exists()


def test_batch_json_holds_the_jobs_that_ended_when_the_runner_dies(tmp_path):
    jobs = [
        {"name": "quick", "run": "echo done > $OUT/result", "minutes": 0.01},
        {"name": "slow", "run": "echo $$ > $OUT/pid; exec sleep 30", "minutes": 0.02},
    ]
    runner = _start(tmp_path, jobs)
    record_path, record, pid = tmp_path / "out" / "batch.json", {}, tmp_path / "work/jobs/slow/pid"
    try:

        def slow_is_running() -> bool:
            nonlocal record
            if not (record_path.is_file() and pid.is_file()):
                return False
            record = json.loads(record_path.read_text())
            return _jobs(record)["slow"]["status"] == "running"

        _wait_until(slow_is_running, "the slow job recorded as running")
        runner.kill()  # a crash: no chance to record or pack anything more
        runner.wait()
    finally:
        if pid.is_file():
            os.killpg(int(pid.read_text()), signal.SIGKILL)
    record = json.loads(record_path.read_text())
    assert _jobs(record)["quick"]["status"] == "ok" and not record["finished"]
    assert _jobs(record)["slow"]["status"] == "running"


def test_a_runner_stopped_by_sigterm_stops_its_jobs_records_and_packs(tmp_path):
    jobs = [
        {"name": "running", "run": "echo started > $OUT/log; exec sleep 30", "minutes": 0.01},
        {"name": "waiting", "run": "true", "minutes": 0.01},
    ]
    runner = _start(tmp_path, jobs, "--grace", "0.5")
    started = tmp_path / "work" / "jobs" / "running" / "log"
    _wait_until(started.is_file, "the running job's start")
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=20) == 130
    record = json.loads((tmp_path / "out" / "batch.json").read_text())
    ran = _jobs(record)
    assert ran["running"]["status"] == "stopped" and "runner was stopped" in ran["running"]["why"]
    assert ran["waiting"]["status"] == "not_run" and not record["finished"]
    assert record["packed"] == ["jobs-1.tar"] and ran["running"]["pack"] == "jobs-1.tar"


def _fake_jobs(tmp_path: Path, sizes: dict[str, int]) -> list:
    """Finished jobs whose folders hold `sizes` bytes of incompressible data and a `.cache`."""
    jobs = []
    for name, size in sizes.items():
        folder = tmp_path / "work" / "jobs" / name
        (folder / "study" / ".cache").mkdir(parents=True)
        (folder / "study" / "data.bin").write_bytes(os.urandom(size))
        (folder / "study" / ".cache" / "stage.pt").write_bytes(os.urandom(size))
        jobs.append(RUNNER.Job(RUNNER.Spec(name, "true", 1, (), (".cache",)), status="ok"))
    return jobs


def test_pack_and_unpack_keep_within_the_files_a_call_returns(tmp_path, monkeypatch):
    # a 16 MiB limit scaled down to 40 KiB, so that ten jobs need more than the 7 bundles
    monkeypatch.setattr(PACK, "FILE_LIMIT", 40 * 1024)
    monkeypatch.setattr(PACK, "BUNDLE_ROOM", 40 * 1024 - 4096)
    sizes = {f"job-{i}": 15_000 for i in range(10)} | {"huge": 50_000}
    jobs = _fake_jobs(tmp_path, sizes)
    out = tmp_path / "out"
    out.mkdir()
    names = PACK.pack(jobs, tmp_path / "work", out)
    files = sorted(out.iterdir())
    assert len(files) == len(names) <= PACK.MAX_FILES - 1
    assert all(f.stat().st_size <= 40 * 1024 for f in files)
    packed = {j.spec.name: j.pack for j in jobs}
    assert packed["huge"].startswith("not returned")
    returned = [n for n, p in packed.items() if p in names]
    assert len(returned) == 2 * len(names)  # two 15 kB jobs to a bundle
    back = tmp_path / "back"
    assert BATCH.main(["unpack", *map(str, files), "--into", str(back)]) == 0
    assert sorted(p.name for p in back.iterdir()) == sorted(returned)
    for name in returned:
        original = tmp_path / "work" / "jobs" / name / "study" / "data.bin"
        assert (back / name / "study" / "data.bin").read_bytes() == original.read_bytes()
        assert not (back / name / "study" / ".cache").exists()  # its `skip`
    assert BATCH.main(["unpack", *map(str, files), "--into", str(back)]) == 2  # never mixed


def test_unpack_refuses_a_file_that_is_no_bundle(tmp_path, capsys):
    stray = tmp_path / "jobs-1.tar"
    with tarfile.open(stray, "w") as tar:
        tar.add(__file__, arcname="test.py")
    assert BATCH.main(["unpack", str(stray), "--into", str(tmp_path / "back")]) == 2
    assert "not a job's NAME.tar.gz" in capsys.readouterr().err
    assert not (tmp_path / "back").exists()


@pytest.mark.parametrize(
    ("text", "options", "says"),
    [
        ("name: a\nrun: 'true'\n", (), "the top level must be a list"),
        ("- {name: a, run: 'true'}\n", (), "has no minutes"),
        ("- {name: a, run: 'true', minutes: 1, gpus: 2}\n", (), "unknown key 'gpus'"),
        ("- {name: a b, run: 'true', minutes: 1}\n", (), "must be letters, digits"),
        ("- {name: a, run: 'true', minutes: 0}\n", (), "minutes must be a number above 0"),
        ("- {name: a, run: 'true', minutes: 1}\n- {name: a, run: 'true', minutes: 1}\n", (),
         "listed twice"),
        ("- {name: a, run: 'true', minutes: 1, after: [z]}\n", (), "which is no job"),
        ("- {name: a, run: 'true', minutes: 1, after: [b]}\n"
         "- {name: b, run: 'true', minutes: 1, after: [a]}\n", (), "in a circle"),
        ("- {name: a, run: 'true', minutes: 1\n", (), "is not YAML at line"),
        ("- {name: a, run: 'true', minutes: 1}\n", ("--only", "b"), "b is no job of the file"),
        ("- {name: a, run: 'true', minutes: 1}\n", ("--budget", "0"), "--budget 0"),
    ],
)  # fmt: skip
def test_a_bad_jobs_file_is_refused_in_one_line(tmp_path, capsys, text, options, says):
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    argv = [str(path), "--out", str(tmp_path / "out"), "--gpus", "1", *options]
    assert BATCH.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("batch.py: error: ") and says in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "batch.json").exists()  # refused before anything ran


def test_gpus_beyond_the_hosts_are_refused():
    found = [{"index": "0", "name": "NVIDIA H100", "driver": "580"}]
    assert RUNNER.gpu_slots(found, None) == [("0", "NVIDIA H100")]
    with pytest.raises(RUNNER.JobsError, match="has 1 GPU"):
        RUNNER.gpu_slots(found, 2)
    with pytest.raises(RUNNER.JobsError, match="give --gpus N"):
        RUNNER.gpu_slots([], None)


def test_the_committed_jobs_file_reads_and_covers_the_work_waiting():
    specs = BATCH.read_jobs(TOOLS / "device" / "jobs" / "records.yaml")
    names = [s.name for s in specs]
    # the cuBLASLt probe first (what the backend may use), then the suite's parts (one commit),
    # the last package, the product benchmark
    suite = ["gpu-kernels", "gpu-package", "gpu-bench-data", "gpu-merge"]
    assert names[:7] == ["lt-probe", *suite, "res2net-package", "products"]
    assert {f"zoo-{i}" for i in range(1, 9)} <= set(names) and "zoo-board" in names
    assert "zoo-rows" in names
    rows = yaml.safe_load((TOOLS / "lab" / "bench" / "peers-rows.yaml").read_text())["models"]
    peers = [f"peers-{i}" for i in range(1, len(rows) + 1)]
    assert [n for n in names if n.startswith("peers-")] == [*peers, "peers-merge"]
    assert set(next(s for s in specs if s.name == "peers-merge").after) == set(peers)
    assert all(s.minutes * 60 <= 560 for s in specs)  # each fits one call's default budget


def test_zoo_rows_keeps_its_rows_in_the_cache_seeded_without_overwriting(tmp_path):
    """The one-GPU zoo job: the committed rows seed .cache/zoo-rows but never replace a row an
    earlier call on the machine measured there; the zoo reads and writes the rows and its
    studies under .cache/ (kept on a warm machine) and runs the alone check."""
    specs = BATCH.read_jobs(TOOLS / "device" / "jobs" / "records.yaml")
    spec = next(s for s in specs if s.name == "zoo-rows")
    committed, cached = tmp_path / "docs" / "results" / "zoo", tmp_path / ".cache" / "zoo-rows"
    committed.mkdir(parents=True)
    cached.mkdir(parents=True)
    (committed / "a.json").write_text("committed a")
    (committed / "b.json").write_text("committed b")
    (cached / "a.json").write_text("measured a")
    command = spec.run.replace("bash tools/device/quantstudy.sh", "echo >> args")
    env = {**os.environ, "JOB_BUDGET_S": "560"}
    subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, check=True)
    assert (cached / "a.json").read_text() == "measured a"
    assert (cached / "b.json").read_text() == "committed b"
    zoo, table = (tmp_path / "args").read_text().splitlines()
    assert table == "tuning-table bench tuning-table"  # after the zoo: this GPU's table again
    args = zoo.split()
    assert args[args.index("--rows") + 1] == ".cache/zoo-rows"
    assert args[args.index("--out") + 1].startswith(".cache/")
    assert args[args.index("--check-alone") + 1] == "resnet50"


def test_the_zoo_jobs_take_their_shard_from_their_name(tmp_path):
    """The zoo's shards share one command (a YAML anchor) and tell their shard by $BATCH_JOB."""
    specs = {s.name: s for s in BATCH.read_jobs(TOOLS / "device" / "jobs" / "records.yaml")}
    command = specs["zoo-3"].run.replace("bash tools/device/quantstudy.sh", "echo")
    jobs = [{"name": "zoo-3", "run": command + " > $OUT/args", "minutes": 0.01}]
    status, _ = _run(tmp_path, jobs, "--gpus", "1", "--budget", "60")
    args = (tmp_path / "work" / "jobs" / "zoo-3" / "args").read_text().split()
    assert status == 0 and args[args.index("--shard") + 1] == "3/8"
