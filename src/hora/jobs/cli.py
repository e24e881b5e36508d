"""``hora job run | manifest | list | describe | logs | metrics | stop | reindex | tune``: argument parsing and
printing only."""

from __future__ import annotations

import argparse
import sys

from hora.errors import ConfigError, HoraError

__all__ = ["add_job_parser", "job_main"]


def add_job_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "job",
        help="run SageMaker script-mode training jobs on this machine",
        description="Run SageMaker script-mode training jobs locally: hosts algo-1..N, SM_* variables, metrics, "
        "failure reasons and artifacts. See docs/jobs.md.",
    )
    p.add_argument("--home", metavar="DIR", help="job store directory (default $HORA_JOB_HOME or ~/.hora)")
    jsub = p.add_subparsers(dest="job_cmd", required=True)
    run = jsub.add_parser("run", help="validate a YAML spec and start the job")
    run.add_argument("spec", help="the job spec (YAML)")
    run.add_argument("--wait", action="store_true", help="run in the foreground, show its output, end with a summary")
    run.add_argument("--job-name", help="override the spec's job_name")
    _add_host_flags(run, "run the job on these hosts over SSH (algo-1 first); the spec's cluster: keeps its other "
                    "settings")
    run.add_argument("--slurm", action="store_true", help="run the job on the nodes of the Slurm allocation this "
                     "runs in (salloc, sbatch), each host started with srun; waits for the job (as --wait)")
    _add_manifest_parser(jsub)
    cl = jsub.add_parser("clean", help="remove the job directories jobs on remote hosts left there (over SSH, or on "
                         "every node of a Ray cluster)")
    _add_host_flags(cl, "the hosts to clean")
    cl.add_argument("--slurm", action="store_true", help="clean every node of the Slurm allocation this runs in, "
                    "with srun")
    cl.add_argument("--job", help="only this job's directory (default: the whole work dir, the shipping cache too)")
    cl.add_argument("--work-dir", help="the work_dir the jobs used (default ~/.hora/remote)")
    cl.add_argument("--ssh-port", type=int, help="the hosts' SSH port")
    cl.add_argument("-i", "--ssh-identity-file", help="the SSH key to use")
    cl.add_argument("--ssh-option", action="append", default=[], help="an ssh -o option (repeatable)")
    jsub.add_parser("list", help="every job in the store")
    d = jsub.add_parser("describe", help="status, failure reason, artifacts and history of a job")
    d.add_argument("job")
    lg = jsub.add_parser("logs", help="a job's log lines, tagged with host and rank")
    lg.add_argument("job")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    lg.add_argument("--host", help="only this host's lines (algo-1, algo-2, ...)")
    m = jsub.add_parser("metrics", help="the metric values parsed from the logs")
    m.add_argument("job")
    m.add_argument("--plot", metavar="FILE.png", help="also draw the curves into FILE.png (needs matplotlib)")
    m.add_argument("--system", action="store_true",
                   help="the hosts' system metrics (CPU, memory, network, disk; profiler_config) instead")
    st = jsub.add_parser("stop", help="stop a running job (SIGTERM to the script, SIGKILL after stop_grace)")
    st.add_argument("job")
    st.add_argument("--wait", action="store_true", help="wait until it has stopped and show the summary")
    it = jsub.add_parser(
        "interrupt", help="simulate a spot reclaim of a managed-spot job: SIGTERM, then it restarts from checkpoints"
    )
    it.add_argument("job")
    it.add_argument("--host", help="the reclaimed host (default algo-1); as on SageMaker, the whole job restarts")
    jsub.add_parser("reindex", help="rebuild a lost or damaged job index (jobs.db) from the job directories")
    _add_tune_parser(jsub)
    rm = jsub.add_parser("rm", help="delete an ended job (its artifacts are kept unless --artifacts)")
    rm.add_argument("job", nargs="+")
    rm.add_argument("--artifacts", action="store_true", help="also delete its local model.tar.gz and output.tar.gz")


def _add_manifest_parser(jsub: argparse._SubParsersAction) -> None:
    mf = jsub.add_parser(
        "manifest", help="write Kubernetes manifests of a spec (an Indexed Job, a headless Service, ConfigMaps, "
        "a Secret)", description="Write the job as Kubernetes objects for kubectl apply -f. See docs/jobs.md, "
        "On Kubernetes: manifests.")
    mf.add_argument("spec", help="the job spec (YAML)")
    mf.add_argument("--image", required=True, help="the container image: Python, hora (jobs extra), the script's "
                    "packages")
    mf.add_argument("-o", "--output", metavar="FILE|DIR",
                    help="write to FILE (one YAML), or to DIR (a file per object; an existing directory or a path "
                    "ending in /); default: standard output")
    mf.add_argument("--namespace", help="the objects' namespace (default: kubectl's current one)")
    mf.add_argument("--name", help="the Job's and Service's name (default: job_name as a DNS label)")
    mf.add_argument("--job-name", help="override the spec's job_name")
    mf.add_argument("--code-in-image", action="store_true",
                    help="the image has the source directory at /opt/ml/code (no code ConfigMap)")
    mf.add_argument("--output-claim", metavar="CLAIM",
                    help="a PersistentVolumeClaim mounted at a local output_path in every pod")
    mf.add_argument("--cpu", help="CPU request and limit per pod (a Kubernetes quantity: 4, 500m)")
    mf.add_argument("--memory", help="memory request and limit per pod (16Gi)")
    mf.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per pod")
    mf.add_argument("--python", default="python3", help="the image's Python command (default python3)")


def _manifest(args: argparse.Namespace) -> int:
    from hora.jobs.k8s_manifest import KubernetesOptions, build_manifests, dump_manifests, write_manifests
    from hora.jobs.spec import load_spec

    spec = load_spec(args.spec, {"job_name": args.job_name} if args.job_name else None)
    options = KubernetesOptions(
        image=args.image, name=args.name, namespace=args.namespace, code_in_image=args.code_in_image,
        output_claim=args.output_claim, cpu=args.cpu, memory=args.memory, gpus=args.gpus, python=args.python,
    )
    objects, notes = build_manifests(spec, options)
    for note in notes:
        print(f"hora job manifest: {note}", file=sys.stderr)
    if args.output is None:
        sys.stdout.write(dump_manifests(objects))
        return 0
    written = write_manifests(objects, args.output)
    name = objects[-1]["metadata"]["name"]
    ns = f" -n {args.namespace}" if args.namespace else ""
    print(f"wrote {len(objects)} object(s) to {', '.join(map(str, written))} (0600: they hold the job's secret)")
    print(f"apply with: kubectl apply -f {args.output}{ns}; watch with: kubectl logs -f job/{name}{ns}")
    return 0


def _add_host_flags(p: argparse.ArgumentParser, hosts_help: str) -> None:
    p.add_argument("--hosts", metavar="H1,H2", help=hosts_help)
    p.add_argument("--hostfile", metavar="FILE", help="the hosts, one per line (host [slots=N]; slots are not used)")
    p.add_argument("--ray", metavar="ADDRESS", help="a Ray cluster (auto, HOST:PORT or ray://HOST:PORT): one host "
                   "algo-K per node (see On a Ray cluster in docs/jobs.md)")


def _clean(args: argparse.Namespace) -> int:
    from hora.jobs.remote_hosts import clean
    from hora.jobs.remote_spec import DEFAULT_WORK_DIR, ClusterSpec, cli_cluster

    if args.slurm:
        from hora.config.variables import environment
        from hora.jobs.slurm_hosts import allocation_cluster

        if args.hosts or args.hostfile or args.ray or args.ssh_port or args.ssh_identity_file or args.ssh_option:
            raise ConfigError("hora job clean --slurm cleans the nodes of the Slurm allocation with srun: leave out "
                              "--hosts/--hostfile/--ray and the SSH options")
        cluster = allocation_cluster(ClusterSpec((), work_dir=args.work_dir or DEFAULT_WORK_DIR), environment(), None,
                                     "hora job clean --slurm")
    elif not (args.hosts or args.hostfile or args.ray):
        raise ConfigError("hora job clean needs --hosts H1,H2, --hostfile FILE, --slurm or --ray ADDRESS")
    else:
        if args.ray and (args.ssh_port or args.ssh_identity_file or args.ssh_option):
            raise ConfigError("hora job clean --ray takes no SSH options: the nodes are reached through Ray")
        cluster = cli_cluster(ClusterSpec((), args.ssh_port, args.ssh_identity_file, tuple(args.ssh_option),
                                          args.work_dir or DEFAULT_WORK_DIR), args.hosts, args.hostfile, 0, args.ray)
    for line in clean(cluster, args.job):
        print(f"removed {line}")
    return 0


def _add_tune_parser(jsub: argparse._SubParsersAction) -> None:
    tune = jsub.add_parser("tune", help="hyperparameter tuning jobs: start one from a spec, list, describe, stop",
                           description="hora job tune SPEC starts a tuning job (a spec with a tuning: section); "
                           "hora job tune list | describe NAME | stop NAME. See docs/tuning.md.")
    tune.add_argument("spec", help="the job spec with a tuning: section (YAML), or list, describe or stop")
    tune.add_argument("name", nargs="?", help="the tuning job (describe, stop)")
    tune.add_argument("--wait", action="store_true", help="wait until the tuning job ends and show its summary")
    tune.add_argument("--job-name", help="the tuning job's name (default: the spec's tuning.job_name, or generated)")
    tune.add_argument("--ray", metavar="ADDRESS", help="run the trials on the Ray cluster at ADDRESS (auto, HOST:PORT "
                      "or ray://HOST:PORT; overrides the spec's tuning.ray_address)")


def _tune(args: argparse.Namespace) -> int:
    from hora.jobs.store import JobStore
    from hora.jobs.tuning import stop_tuning_job, wait_tuning_job
    from hora.jobs.tuning_store import TuningStore
    from hora.jobs.tuning_views import tuning_describe, tuning_summary, tuning_table

    tstore = TuningStore(JobStore(args.home))
    action = args.spec
    if action in ("describe", "stop") and not args.name:
        raise ConfigError(f"hora job tune {action} needs the tuning job's name (hora job tune list shows them)")
    if action == "list":
        print(tuning_table(tstore))
        return 0
    if action == "describe":
        print(tuning_describe(tstore, args.name))
        return 0
    if action == "stop":
        state = stop_tuning_job(tstore, args.name)
        if state["status"] in ("Completed", "Failed", "Stopped"):
            print(f"tuning job {args.name} has already ended: {state['status']}")
            return 0
        print(f"stopping tuning job {args.name} and its running trials")
        if args.wait:
            wait_tuning_job(tstore, args.name)
            print(tuning_summary(tstore, args.name))
        return 0
    from hora.jobs.tuning_spec import load_tuning_spec

    if args.name:
        raise ConfigError(f"hora job tune SPEC takes no second argument (got {args.name!r}); name the tuning job "
                          "with --job-name")

    tuner, name = load_tuning_spec(action, tstore.jobs.home, ray_address=args.ray)
    tuner.fit(job_name=args.job_name or name, wait=False)
    name = tuner.latest_tuning_job.name  # type: ignore[union-attr]
    limits = tuner.tuning_config(name)["HyperParameterTuningJobConfig"]["ResourceLimits"]
    where = f" on the Ray cluster at {tuner.ray_address}" if tuner.ray_address else ""
    print(f"started tuning job {name} ({tuner.strategy}: {limits['MaxNumberOfTrainingJobs']} trial(s), at most "
          f"{tuner.max_parallel_jobs} at once{where}) in {tstore.dir(name)}")
    if not args.wait:
        print(f"follow it with: hora job tune describe {name}")
        return 0
    state = wait_tuning_job(tstore, name)
    print(tuning_summary(tstore, name))
    return 0 if state["status"] == "Completed" else 1


def _progress(message: str) -> None:
    print(f"hora job: {message}", file=sys.stderr, flush=True)


def job_main(args: argparse.Namespace) -> int:
    from hora.jobs import views
    from hora.jobs.api import interrupt_job, reconcile, remove_job, start_job, stop_job, wait_job
    from hora.jobs.spec import load_spec
    from hora.jobs.states import JobStatus
    from hora.jobs.store import JobStore

    store = JobStore(args.home)
    try:
        if args.job_cmd == "tune":
            return _tune(args)
        if args.job_cmd == "manifest":
            return _manifest(args)
        if args.job_cmd == "clean":
            return _clean(args)
        if args.job_cmd == "run":
            spec = load_spec(args.spec, {"job_name": args.job_name} if args.job_name else None)
            named = args.hosts or args.hostfile or args.ray
            if args.slurm and named:
                raise ConfigError("give --hosts/--hostfile (hosts over SSH), --slurm (the nodes of the Slurm "
                                  "allocation) or --ray (a Ray cluster), not two of them")
            if args.slurm or (spec.cluster is not None and spec.cluster.slurm and not named):
                import dataclasses

                from hora.config.variables import environment
                from hora.jobs.slurm_hosts import allocation_cluster

                spec = dataclasses.replace(spec, cluster=allocation_cluster(
                    spec.cluster, environment(), spec.instance_count, f"hora job run {args.spec} --slurm"))
                if not args.wait:  # the allocation ends with this command: the job must end before it does
                    _progress("inside a Slurm allocation the job runs in the foreground (as --wait): the "
                              "allocation ends when this command does")
                    args.wait = True
            elif named:
                import dataclasses

                from hora.jobs.remote_spec import cli_cluster

                spec = dataclasses.replace(spec, cluster=cli_cluster(spec.cluster, args.hosts, args.hostfile,
                                                                     spec.instance_count, args.ray))
            if spec.cluster is not None and not spec.cluster.hosts and spec.cluster.backend != "ray":
                raise ConfigError("the spec's cluster: names no hosts; list them in cluster.hosts (or hostfile) or "
                                  "give them with --hosts H1,H2")
            if not args.wait:
                record = start_job(spec, store, wait=False)
                print(f"started job {record.name} ({spec.instance_count} host(s) x {spec.processes_per_host} "
                      f"process(es)) in {record.job_dir}")
                print(f"follow it with: hora job logs --follow {record.name}")
                return 0
            _progress(f"job {spec.job_name}: {spec.instance_count} host(s) x {spec.processes_per_host} process(es)")
            record = start_job(spec, store, wait=True, progress=_progress)
            print(views.summary(record), file=sys.stderr, flush=True)
            return 0 if record.status == JobStatus.Completed else 1
        if args.job_cmd == "list":
            print(views.job_table([reconcile(store, r) for r in store.jobs()]))
            lost = store.unindexed()
            if lost:
                print(f"hora job: {store.lost_index_hint(lost)}", file=sys.stderr)
        elif args.job_cmd == "reindex":
            from hora.jobs.reindex import rebuild

            added, moved = rebuild(store)
            if moved is not None:
                print(f"moved the damaged index aside to {moved}")
            print(f"indexed {len(added)} job(s) from {store.jobs_dir}" + (f": {', '.join(added)}" if added else ""))
        elif args.job_cmd == "describe":
            reconcile(store, store.get(args.job))
            print(views.describe(store, args.job))
        elif args.job_cmd == "logs":
            lines = views.follow_logs(store, args.job, args.host) if args.follow else views.read_logs(
                store, args.job, args.host)
            for line in lines:
                print(line, flush=args.follow)
        elif args.job_cmd == "metrics":
            table = views.system_metrics_table if args.system else views.metrics_table
            for line in table(store, args.job):
                print(line)
            if args.plot:
                print(f"plotted to {views.plot_metrics(store, args.job, args.plot, system=args.system)}")
        elif args.job_cmd == "rm":
            for name in args.job:
                kept, removed = remove_job(store, name, args.artifacts)
                said = [f"kept {', '.join(kept)}"] if kept else []
                said += [f"deleted {', '.join(removed)}"] if removed else []
                print(f"removed job {name}" + (f" ({'; '.join(said)})" if said else ""))
        elif args.job_cmd == "interrupt":
            record = interrupt_job(store, args.job, args.host)
            print(f"interrupting job {record.name} ({args.host or 'algo-1'} reclaimed); it restarts from its "
                  "checkpoints")
        elif args.job_cmd == "stop":
            record = stop_job(store, args.job)
            if record.done:
                print(f"job {record.name} has already ended: {record.status}")
                return 0
            print(f"stopping job {record.name}")
            if args.wait:
                print(views.summary(wait_job(store, args.job)))
    except HoraError as exc:
        print(f"hora job: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
