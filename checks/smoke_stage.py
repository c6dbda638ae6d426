"""The smoke stage: the smoke job trained through the launcher the team uses."""

from __future__ import annotations

from pyinfra.api import State, StringCommand

from checks.preflight_report import PreflightReport
from checks.smoke_verdicts import smoke_problems, smoke_reports
from checks.stage_runner import (
    BOUNDS,
    private_workdir,
    refusals,
    run_everywhere,
    shell_stage,
    stage_script,
)
from trainfleet.defaults import LAUNCH_DIR, RUN_DIR
from trainfleet.model import Cluster
from trainfleet.schema import smoke_launcher_problem

_SMOKE = stage_script("smoke.sh")


SMOKE_JOB = f"{LAUNCH_DIR}/smoke_train.py"


SMOKE_FROM_MASTER = frozenset(
    {"mpirun", "deepspeed", "colossalai"}
)  # runners that start every node's ranks


def smoke_command(cluster: Cluster, launcher: str) -> StringCommand:
    """The smoke job through ``launcher``'s file in LAUNCH_DIR, bounded, from a private
    directory (its stderr lands there) with the launch itself started from /."""
    if problem := smoke_launcher_problem(launcher):
        raise ValueError(f"smoke launcher: {problem}")
    seconds = BOUNDS["smoke"]
    # --deadline: ranks a runner started over ssh on other nodes outlive its timeout; they end
    # themselves
    launch = [f"{LAUNCH_DIR}/{launcher}.sh"]
    job = [SMOKE_JOB, "--timeout", str(seconds // 2), "--deadline", str(seconds - 10)]
    if launcher == "mpirun":  # OpenMPI sets no MASTER_ADDR: the job is told; its daemons'
        # session files go in root's RUN_DIR (every earlier stage made it), not a /tmp a user can
        # reach first
        launch += ["--mca", "orte_tmpdir_base", RUN_DIR]
        job = [
            cluster.job_python,
            *job,
            "--master-addr",
            cluster.master.address,
            "--master-port",
            str(cluster.master_port),
        ]
    return shell_stage(
        private_workdir(RUN_DIR) + _SMOKE, seconds, *launch, *job, bound=seconds + 10
    )


def run_smoke(state: State, cluster: Cluster, report: PreflightReport, launcher: str) -> None:
    """The smoke job trained through the launcher the team uses, from its generated file."""
    starters = [cluster.master] if launcher in SMOKE_FROM_MASTER else cluster.nodes
    out = run_everywhere(
        state, {n.name: smoke_command(cluster, launcher) for n in starters}, BOUNDS["smoke"]
    )
    report.details["smoke"] = {
        "launcher": launcher,
        "ranks": {rank: r for lines in out.values() for rank, r in smoke_reports(lines).items()},
    }
    report.problems += refusals("smoke", out) + smoke_problems(cluster, launcher, out)
