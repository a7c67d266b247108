"""--executor dask (issue #15): a job's ranks analysed on a real Dask distributed cluster (a
LocalCluster of worker processes, as a real cluster runs them) give the job the local pool
gives; the CLI drives it, with its own cluster or an existing one (--scheduler); a rank that
fails, a bad address and a missing Dask are one-line errors."""
import json
import os

import pytest

from navdoctor.ranks.detect import job_ranks
from navdoctor.ranks.executor import run_ranks
from navdoctor.ranks.job import build_job
from navdoctor.rules import load_rules
from ranks_factory import make_job

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster():
    # Real worker processes (not threads of this one), one thread each, little memory: what
    # the executor's own LocalCluster is, and what a remote cluster's workers are.
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  memory_limit="1GiB", dashboard_address=None,
                                  silence_logs=50) as c:
        yield c


@pytest.fixture(scope="module")
def straggler_job(tmp_path_factory):
    # rank 1's data loading is 15 ms slower per step; the others wait in the all-reduce
    return make_job(tmp_path_factory.mktemp("job"), ranks=3, data_us=[500, 15500, 500], steps=4)


def job_of(paths, **how):
    rules = load_rules()
    return build_job(run_ranks(job_ranks([str(p) for p in paths]), rules, **how), rules, None,
                     lambda m: None)


def test_dask_cluster_gives_the_local_pools_job(straggler_job, cluster):
    pool = job_of(straggler_job, workers=2)
    prefixes = cluster.scheduler.task_prefixes
    before = prefixes["navdoctor-rank"].state_counts["memory"] if "navdoctor-rank" in prefixes else 0
    on_dask = job_of(straggler_job, executor="dask", scheduler=cluster.scheduler_address)
    assert on_dask.job == pool.job
    assert on_dask.job["straggler"]["rank"] == 1 and on_dask.job["straggler"]["cause"] == "data"
    assert on_dask.analysis.verdict == pool.analysis.verdict
    assert [f.rule.id for f in on_dask.analysis.findings] == \
        [f.rule.id for f in pool.analysis.findings]
    # the ranks ran as tasks of this cluster (its scheduler lives in this process)
    prefix = prefixes["navdoctor-rank"]
    assert prefix.state_counts["memory"] - before == 3    # each rank's outcome was made on a worker,
    assert prefix.states["memory"] == 0           # and released there once fetched


def test_cli_executor_dask_starts_its_own_cluster(straggler_job, cli):
    job_dir = os.path.dirname(straggler_job[0])
    local = cli("analyze", "--ranks", job_dir, "--executor", "local", "--json", "-")
    dask = cli("analyze", "--ranks", job_dir, "--executor", "dask", "--workers", "2",
               "--json", "-")
    assert local.returncode == 0 and dask.returncode == 0, dask.stderr
    assert dask.stdout == local.stdout      # the same report, byte for byte
    assert json.loads(dask.stdout)["job"]["straggler"]["rank"] == 1


def test_cli_scheduler_uses_an_existing_cluster(straggler_job, cluster, cli):
    r = cli("analyze", "--ranks", os.path.dirname(straggler_job[0]),
            "--scheduler", cluster.scheduler_address, "--json", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["job"]["straggler"]["rank"] == 1


def test_a_failing_rank_is_one_line(tmp_path, cluster, cli):
    paths = make_job(tmp_path, ranks=2, steps=2)
    text = open(paths[1]).read()
    at = text.index('"ts"', len(text) // 2)   # distributedInfo stays readable, the events not
    open(paths[1], "w").write(text[:at] + '"ts": oops, ' + text[at:])
    r = cli("analyze", "--ranks", tmp_path, "--scheduler", cluster.scheduler_address, "-q")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "rank1.json" in r.stderr and "malformed" in r.stderr


@pytest.mark.parametrize("args, says", [
    (["--scheduler", "nowhere"], "not a Dask scheduler address"),
    (["--scheduler", "tcp://127.0.0.1:9"], "cannot reach a Dask scheduler"),
    (["--executor", "local", "--scheduler", "tcp://127.0.0.1:9"], "--scheduler is for"),
    (["--scheduler", "tcp://127.0.0.1:9", "--workers", "2"], "cluster's own workers"),
])
def test_bad_executor_options_are_one_line(straggler_job, cli, args, says):
    r = cli("analyze", "--ranks", os.path.dirname(straggler_job[0]), *args, "-q",
            env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "1s"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


def test_without_dask_the_error_says_how_to_install(straggler_job, tmp_path, cli):
    # A folder first on the path whose `distributed` cannot be imported: Dask as absent as a
    # machine without it has it.
    (tmp_path / "distributed.py").write_text("raise ImportError('no distributed here')\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = cli("analyze", "--ranks", os.path.dirname(straggler_job[0]), "--executor", "dask",
            env={"PYTHONPATH": os.pathsep.join([str(tmp_path), root])})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "pip install 'navdoctor[dask]'" in r.stderr
