"""How ``hora job`` reaches the nodes of a Slurm allocation: ``python -m hora.jobs._srun_rsh JOB_ID NODE COMMAND``,
used by hora run and :mod:`hora.jobs.remote_hosts` in place of ``ssh NODE COMMAND`` (``SshOptions.agent``).

It runs the shell command as a one-task job step of the allocation on that node::

    srun --jobid=JOB_ID --overlap --nodes=1 --ntasks=1 --nodelist=NODE --kill-on-bad-exit=1 --quiet --unbuffered
         --export=PATH,HOME,... --job-name=hora-job /bin/sh -c '<marker>; exec /bin/sh -c "$1"' sh COMMAND

- ``--overlap``: the job's steps (a host's agent, its Pipe feeder, a probe) run side by side on the same CPUs, and
  the step gets every CPU, GPU and the memory the job holds on the node (no ``--exact``, no per-task counts: the
  allocation's own ``SLURM_*`` shape variables, such as an sbatch ``-c``, are not passed to srun).
- ``--unbuffered``: slurmstepd otherwise holds a task's output until a newline, and hora run's agent speaks binary
  frames on stdout; with it the task's stdout is a raw pseudo-terminal, every byte passed on as written.
- stdin is srun's (this process's) own: the job's secret reaches hora run's agent there, never on a command line or
  in an environment. ``--export``: the step's environment holds only the login variables listed (as an SSH login
  would give) and Slurm's own; hora run's agent gives the ranks the launcher's environment.
- The exit status is the command's; 255, as ssh's, when srun could not start the step (a node not in the job, a
  job that has ended, slurmd unreachable: the remote shell never printed the marker) or lost the node.
- Killing this process (hora run kills its process group; the launcher's death kills it through
  ``PR_SET_PDEATHSIG``) kills srun (``PR_SET_PDEATHSIG`` too), and srun's shepherd, a child it forks to watch it,
  then cancels the step: its processes on the node end within a second or two. srun runs in a session of its own
  for that: killed with srun's process group, the shepherd would die with it and leave the step running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping

from hora._proc import die_with_parent
from hora.config.variables import environment
from hora.jobs.records import unreachable

#: What the step's shell prints on stderr before anything else: seen, the step started on the node.
MARKER = "hora-srun-step-started"
#: The login variables a step gets from here (as an SSH login gets them there); Slurm adds its own.
EXPORTED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TMPDIR")
#: srun's variables that it reads as the step's shape (allocation-wide values from salloc/sbatch) are not given to
#: srun; these are how it finds and authenticates to the cluster, and are kept.
_SRUN_KEEPS = ("SLURM_CONF", "SLURM_JWT")
#: srun's lines about the task's end (the exit status says it), dropped from stderr.
_STATUS = re.compile(rb"^srun: error: (\S+: task \d+: |IO: Hey, you told me node \d+ was down)")
#: srun's lines that say the node was lost while the step ran.
_LOST = re.compile(rb"^srun: error: .*(Node failure|[Cc]ommunication connection failure)")


def srun_command(job_id: str, node: str, command: str, env: Mapping[str, str]) -> list[str]:
    """The srun argv that runs ``command`` on ``node`` as a step of job ``job_id`` (no secret goes into it)."""
    exported = [k for k in EXPORTED if k in env] or ["PATH=/usr/local/bin:/usr/bin:/bin"]
    return ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            "--kill-on-bad-exit=1", "--quiet", "--unbuffered", f"--export={','.join(exported)}",
            "--job-name=hora-job", "/bin/sh", "-c", f'echo {MARKER} >&2 && exec /bin/sh -c "$1"', "sh", command]


def srun_environment(env: Mapping[str, str]) -> dict[str, str]:
    """srun's own environment: ``env`` without the allocation's ``SLURM_*`` variables (but its config and token)."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k in _SRUN_KEEPS}



def main() -> None:
    job_id, node, command = sys.argv[1], sys.argv[2], sys.argv[3]
    env = environment()
    try:
        proc = subprocess.Popen(srun_command(job_id, node, command, env), env=srun_environment(env),
                                stderr=subprocess.PIPE, preexec_fn=die_with_parent,  # stdin, stdout: ours
                                start_new_session=True)
    except FileNotFoundError:
        unreachable(f"node {node}: srun is not installed on this machine (hora job --slurm starts each host with srun)")
        return
    assert proc.stderr is not None
    started, lost = False, False
    held: list[bytes] = []
    for raw in proc.stderr:
        if not started:
            if raw.rstrip(b"\r\n") == MARKER.encode():
                started = True
                sys.stderr.buffer.write(b"".join(held))
                sys.stderr.buffer.flush()  # os._exit below flushes nothing
            else:
                held.append(raw)
            continue
        if _STATUS.match(raw):
            continue
        lost = lost or _LOST.match(raw) is not None
        sys.stderr.buffer.write(raw)
        sys.stderr.buffer.flush()
    code = proc.wait()
    if not started:
        said = " / ".join(line.decode(errors="replace").strip() for line in held if line.strip())
        unreachable(f"node {node}: srun could not start a step of Slurm job {job_id} there (srun exited with {code}"
              + (f": {said})" if said else ")"))
    if lost:
        unreachable(f"node {node}: srun lost the node while the step ran (Slurm job {job_id})")
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
