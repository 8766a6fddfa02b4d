"""The user's verbs on a cluster: submit, list, describe, logs, wait, cancel, fetch, plot, tensorboard.

Each is a thin shell over :class:`dgx_operator.client.Client` (the Python client does the same
work), printing tables as kubectl does and sending notes to stderr so stdout stays clean for a pipe.
The same parser serves ``kubedgx VERB`` and ``kubectl dgx VERB`` (the ``kubectl-dgx`` executable,
krew's convention). Every error is one line naming what to do, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from dgx_operator.api.vocabulary import JobPhase
from dgx_operator.client import Client, ClientError, JobFailedError, WaitTimeoutError
from dgx_operator.client.jobs import LogLine, condition, ended_reason, finished, read_manifests
from dgx_operator.client.lines import age_text, describe_event, duration_text, eta_seconds, loss_text, step_text
from dgx_operator.render.names import CONTAINER_NAME

#: `wait`'s exit codes.
WAIT_SUCCEEDED, WAIT_FAILED, WAIT_ERROR, WAIT_TIMEOUT = 0, 1, 2, 3


def now() -> datetime:
    return datetime.now(UTC)


def _client(args: argparse.Namespace) -> Client:
    return Client(getattr(args, "namespace", None), kubeconfig=args.kubeconfig, context=args.context)


def _guarded(fn: Callable[[argparse.Namespace, TextIO, TextIO], int]) -> Callable[..., int]:
    """A verb whose client errors become one line on stderr and exit code 1 (2 for `wait`'s own)."""

    def run(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
        args.stdin = stdin
        try:
            return fn(args, out, err)
        except ClientError as exc:
            print(f"kubedgx {args.command}: {exc}", file=err)
            return WAIT_ERROR if args.command == "wait" else 1
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:  # `kubedgx logs x | head`
            return 0

    return run


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2, sort_keys=False, default=str)
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def _job_dict(job: Any) -> dict[str, Any]:
    data: dict[str, Any] = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    return data


# -- submit ------------------------------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = _client(args)
    documents: list[dict[str, Any]] = []
    for path in args.files:
        try:
            text = args.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            print(f"kubedgx submit: {path}: cannot read: {exc.strerror}", file=err)
            return 1
        documents += read_manifests(text, "stdin" if path == "-" else path)
    if not documents:
        print("kubedgx submit: no objects in the given files", file=err)
        return 1
    done = client.submit_all(documents, dry_run=args.dry_run)
    for warning in client.api.warnings:
        print(f"Warning: {warning}", file=err)
    jobs = []
    for item in done:
        print(
            f"{item.kind.lower()}/{item.name} {item.action}" + (" (server dry run)" if args.dry_run else ""), file=out
        )
        if item.kind == "DGXTrainingJob":
            jobs.append(item)
    if jobs and not args.dry_run and not args.quiet:
        flags = "" if all(j.namespace == client.api.namespace for j in jobs) else f" -n {jobs[0].namespace}"
        name = jobs[0].name
        print(
            f"follow it:     kubedgx logs -f {name}{flags}\n"
            f"see it:        kubedgx describe {name}{flags}\n"
            f"wait for it:   kubedgx wait {name}{flags}",
            file=err,
        )
    return 0


# -- list --------------------------------------------------------------------------------------------


def _eta(job: Any) -> str:
    status = job.status
    if status is None or status.phase != JobPhase.RUNNING or status.progress is None:
        return "-"
    if status.attempt or status.restarts:
        return "-"  # a resumed run's pace since its start counts steps it did not make: no honest ETA
    p = status.progress
    seconds = eta_seconds(p.step, p.total_steps, status.start_time, p.updated_at)
    return duration_text(seconds)


def list_rows(jobs: Sequence[Any], *, all_namespaces: bool, wide: bool, at: datetime) -> list[list[str]]:
    head = ["NAME", "PHASE", "NODES", "STEP", "LOSS", "ETA", "RESTARTS", "GPU-HOURS", "COST", "AGE"]
    if all_namespaces:
        head.insert(0, "NAMESPACE")
    if wide:
        head += ["REASON", "INSTANCE"]
    rows = [head]
    for job in jobs:
        s = job.status
        progress = s.progress if s else None
        usage = s.usage if s else None
        cost = "-"
        if usage is not None and usage.cost is not None:
            cost = f"{usage.cost} {usage.currency or ''}".strip()
        row = [
            job.metadata.name,
            (s.phase if s and s.phase else "Pending"),
            (s.nodes if s and s.nodes else "-"),
            step_text(progress.step if progress else None, progress.total_steps if progress else None),
            loss_text(progress.loss if progress else None),
            _eta(job),
            str(s.restarts if s else 0),
            usage.gpu_hours if usage is not None and usage.gpu_hours is not None else "-",
            cost,
            age_text(job.metadata.creation_timestamp, at),
        ]
        if all_namespaces:
            row.insert(0, job.metadata.namespace or "")
        if wide:
            reason = "-"
            if s and s.phase:
                cond = condition(job, "Finished")
                reason = (cond.reason if cond and cond.reason else "-") if s else "-"
            row += [reason, job.spec.instance]
        rows.append(row)
    return rows


def cmd_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = _client(args)
    jobs = client.list_jobs(all_namespaces=args.all_namespaces)
    if args.output in ("json", "yaml"):
        body = {"apiVersion": "v1", "kind": "List", "items": [_job_dict(j) for j in jobs]}
        print(_dump(body, args.output).rstrip("\n"), file=out)
        return 0
    if args.output == "name":
        for job in jobs:
            print(f"dgxtrainingjob/{job.metadata.name}", file=out)
        return 0
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {client.namespace}"
        print(f"No DGXTrainingJobs in {where}.", file=err)
        return 0
    rows = list_rows(jobs, all_namespaces=args.all_namespaces, wide=args.output == "wide", at=now())
    print(_table(rows), file=out)
    return 0


# -- describe ------------------------------------------------------------------------------------


def describe_text(client: Client, name: str, at: datetime) -> str:
    job = client.get(name)
    s = job.status
    lines: list[str] = []

    def field(label: str, value: str) -> None:
        lines.append(f"{label + ':':<13}{value}")

    field("Name", job.metadata.name)
    field("Namespace", job.metadata.namespace or client.namespace)
    phase = s.phase if s and s.phase else "Pending"
    since = ""
    if s and s.start_time and phase == JobPhase.RUNNING:
        since = f" for {duration_text((at - s.start_time).total_seconds())}"
    field("Phase", phase + since)
    nodes = s.nodes if s and s.nodes else "-"
    field("Instance", f"{job.spec.instance}, nodes {nodes}, restarts {s.restarts if s else 0}/{job.spec.backoff_limit}")
    if s and s.progress is not None and s.progress.step is not None:
        p = s.progress
        event = {"event": "progress", **p.model_dump(mode="json", by_alias=True, exclude_none=True)}
        eta = _eta(job)
        when = f", reported {age_text(p.updated_at, at)} ago" if p.updated_at else ""
        field("Progress", describe_event(event) + (f"  ETA {eta}" if eta != "-" else "") + when)
    if s and s.usage is not None and s.usage.gpu_hours is not None:
        u = s.usage
        money = f", {u.cost} {u.currency}" if u.cost is not None else ""
        example = " (the catalog's example prices)" if u.example_prices else ""
        field("Used", f"{u.gpu_hours} GPU-hours{money}{example}")
    if s and s.conditions:
        lines.append("Conditions:")
        rows = [["TYPE", "STATUS", "REASON", "MESSAGE"]]
        rows += [[c.type, c.status, c.reason or "", c.message or ""] for c in s.conditions]
        lines += ["  " + r for r in _table(rows).splitlines()]
    workers = client.workers(name)
    lines.append("Workers:" if workers else "Workers:    none now")
    if workers:
        rows = [["RANK", "POD", "NODE", "PHASE", "READY", "RESTARTS", "TRAINER"]]
        for w in workers:
            rank = str(w.rank) if w.rank is not None else "-"
            rows.append([rank, w.name, w.node or "-", w.phase, "yes" if w.ready else "no", str(w.restarts), w.state])
        lines += ["  " + r for r in _table(rows).splitlines()]
    mounts = client.mounts(job)
    if mounts:
        lines.append("Data mounts:")
        rows = [["NAME", "PATH", "DIRECTION", "PHASE", "SOURCE", "MESSAGE"]]
        for m in mounts:
            rows.append([m.name, m.mount_path, m.direction or "-", m.phase or "-", m.source or "-", m.message or ""])
        lines += ["  " + r for r in _table(rows).splitlines()]
    if s and s.artifacts:
        lines.append("Artifacts:")
        rows = [["NAME", "URI", "MOUNT"]] + [[a.name, a.uri, a.mount or "-"] for a in s.artifacts]
        lines += ["  " + r for r in _table(rows).splitlines()]
    events = client.events(name)
    lines.append("Events:" if events else "Events:     none")
    if events:
        rows = [["AGE", "TYPE", "REASON", "OBJECT", "MESSAGE"]]
        for e in events:
            count = f" (x{e.count})" if e.count > 1 else ""
            rows.append([age_text(e.last, at), e.type, e.reason, e.object, e.message + count])
        lines += ["  " + r for r in _table(rows).splitlines()]
    lines.append("Next:")
    hints: list[tuple[str, str]] = []
    if finished(job):
        if s and s.phase == JobPhase.SUCCEEDED and s.artifacts:
            hints.append((f"kubedgx fetch {name}", "download the adapter"))
        hints += [(f"kubedgx plot {name}", "the loss curve"), (f"kubedgx logs {name}", "what worker 0 printed")]
    else:
        hints += [(f"kubedgx logs -f {name}", "follow worker 0"), (f"kubedgx wait {name}", "until it ends")]
    width = max(len(command) for command, _ in hints)
    lines += [f"  {command.ljust(width)}   # {why}" for command, why in hints]
    return "\n".join(lines)


def cmd_describe(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = _client(args)
    if args.output in ("json", "yaml"):
        job = client.get(args.job)
        body = {
            "job": _job_dict(job),
            "workers": [w.__dict__ for w in client.workers(args.job)],
            "dataMounts": [m.__dict__ for m in client.mounts(job)],
            "events": [{**e.__dict__, "last": e.last.isoformat() if e.last else None} for e in client.events(args.job)],
        }
        print(_dump(body, args.output).rstrip("\n"), file=out)
        return 0
    print(describe_text(client, args.job, now()), file=out)
    return 0


# -- logs ------------------------------------------------------------------------------------------


def _shown(line: LogLine, *, raw: bool, prefix: bool) -> str:
    text = line.text if raw else line.shown
    return f"[rank {line.rank}] {text}" if prefix else text


def cmd_logs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = _client(args)
    if args.follow:
        job = client.get(args.job)
        if not finished(job) and not client.workers(args.job):
            print(f"waiting for {args.job}'s workers ({job.status.phase if job.status else 'new'})...", file=err)
    lines = client.logs(
        args.job,
        rank=args.rank,
        all_ranks=args.all,
        follow=args.follow,
        container=args.container,
        tail=args.tail,
    )
    for line in lines:
        out.write(_shown(line, raw=args.raw, prefix=args.all) + "\n")
        out.flush()
    if args.follow:
        job = client.get(args.job)
        if finished(job):
            reason, message = ended_reason(job)
            print(f"{args.job}: {job.status.phase if job.status else ''} ({reason}) {message}".rstrip(), file=err)
    return 0


# -- wait ------------------------------------------------------------------------------------------


def cmd_wait(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = _client(args)
    try:
        job = client.wait(args.job, timeout=args.timeout)
    except JobFailedError as exc:
        print(f"{args.job}: Failed ({exc.reason}): {exc.message}", file=err)
        return WAIT_FAILED
    except WaitTimeoutError as exc:
        print(f"kubedgx wait: {exc}", file=err)
        return WAIT_TIMEOUT
    reason, message = ended_reason(job)
    print(f"{args.job}: Succeeded ({reason}){': ' + message if message else ''}", file=out)
    return WAIT_SUCCEEDED


# -- cancel ------------------------------------------------------------------------------------------


def cmd_cancel(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = _client(args)
    job = client.cancel(args.job, wait=args.wait, timeout=args.timeout)
    phase = job.status.phase if job.status and job.status.phase else "Pending"
    print(f"dgxtrainingjob/{args.job} cancelled (it was {phase})", file=out)
    if not finished(job):
        print(
            "its workers stop within their grace period; a checkpoint upload in flight finishes first, and its "
            "GPU-hours stay in its budgets' ledgers",
            file=err,
        )
    return 0


# -- fetch -------------------------------------------------------------------------------------------


def cmd_fetch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = _client(args)
    if args.list:
        listed = client.artifacts(args.job)
        if args.output in ("json", "yaml"):
            body = [{"name": n, "uri": u, "mount": m} for n, u, m in listed]
            print(_dump(body, args.output).rstrip("\n"), file=out)
            return 0
        rows = [["NAME", "URI", "MOUNT"]] + [[n, u, m or "-"] for n, u, m in listed]
        print(_table(rows) if len(rows) > 1 else f"{args.job} has no artifacts", file=out)
        return 0
    target = client.fetch(args.job, args.artifact, Path(args.dest))
    print(str(target), file=out)
    return 0


# -- plot --------------------------------------------------------------------------------------------


def cmd_plot(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from dgx_api.history import read_dir
    from dgx_operator.client import plot

    if args.dir is not None:
        points = read_dir(Path(args.dir))
        title = str(args.dir)
    else:
        if args.job is None:
            print("kubedgx plot: name a job, or --dir OUTPUT_DIR of a local run", file=err)
            return 2
        client = _client(args)
        points = client.history(args.job)
        title = f"{client.namespace}/{args.job}"
    try:
        if args.output:
            plot.write(points, Path(args.output), title=title)
            print(args.output, file=out)
        else:
            width = args.width or min(120, shutil.get_terminal_size((100, 24)).columns)
            print(plot.text(points, width=width, height=args.height), file=out)
    except plot.PlotError as exc:
        print(f"kubedgx plot: {exc}", file=err)
        return 1
    return 0


# -- tensorboard -------------------------------------------------------------------------------------


def _kubectl_base(args: argparse.Namespace, namespace: str) -> list[str]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ClientError("kubectl is not on PATH: it copies the event files out of the running pod")
    base = [kubectl]
    if args.kubeconfig:
        base += ["--kubeconfig", args.kubeconfig]
    if args.context:
        base += ["--context", args.context]
    return [*base, "-n", namespace]


def copy_from_pod(args: argparse.Namespace, client: Client, pod: str, output_dir: str, logdir: Path) -> None:
    """The run's TensorBoard directory (``<output.dir>/runs``) copied out of a running worker with
    ``kubectl exec ... tar``, as ``kubectl cp`` does."""
    tar_runs = ["tar", "cf", "-", "-C", output_dir, "runs"]
    argv = [*_kubectl_base(args, client.namespace), "exec", pod, "-c", CONTAINER_NAME, "--", *tar_runs]
    logdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tar:
        done = subprocess.run(argv, stdout=tar, stderr=subprocess.PIPE, timeout=300, check=False)
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()[-300:]
            raise ClientError(f"cannot copy {output_dir}/runs out of {pod}: {said}")
        tar.seek(0)
        import tarfile

        with tarfile.open(fileobj=tar, mode="r:") as archive:
            archive.extractall(logdir, filter="data")


def tensorboard_source(args: argparse.Namespace, client: Client, logdir: Path) -> Callable[[], str]:
    """A function that brings the job's event files into ``logdir`` (again, on each call) and says
    from where: the running rank 0's pod while it trains, else the Out mount (uploaded by the
    checkpoint sidecar, ``<source>/<job>-<uid8>/logs/runs``)."""
    job = client.get(args.job)
    trainer = job.spec.trainer
    if trainer is not None and "tensorboard" not in trainer.training.report_to:
        raise ClientError(
            f"{args.job} writes no TensorBoard logs: add tensorboard to spec.trainer.training.reportTo "
            "(and submit it again); kubedgx plot draws its loss curve without them"
        )
    output_dir = trainer.output.dir if trainer is not None else "/workspace/output"
    worker = next((w for w in client.workers(args.job) if w.rank == 0 and w.state == "running"), None)
    if worker is not None and not args.from_mount:

        def from_pod() -> str:
            copy_from_pod(args, client, worker.name, output_dir, logdir)
            return f"pod {worker.name}"

        return from_pod

    def from_mount() -> str:
        return client.tensorboard_logs(args.job, logdir)

    return from_mount


def _tensorboard_command(logdir: Path, port: int, host: str) -> list[str]:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        base = [sys.executable, "-m", "tensorboard.main"]
    elif shutil.which("tensorboard"):
        base = [str(shutil.which("tensorboard"))]
    else:
        raise ClientError(f"TensorBoard is not installed here: pip install tensorboard (the logs are in {logdir})")
    return [*base, "--logdir", str(logdir), "--port", str(port), "--host", host]


def cmd_tensorboard(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = _client(args)
    logdir = Path(args.logdir) if args.logdir else Path(tempfile.mkdtemp(prefix=f"kubedgx-tb-{args.job}-"))
    refresh = tensorboard_source(args, client, logdir)
    where = refresh()
    print(f"{args.job}'s TensorBoard logs from {where} in {logdir}", file=err)
    if args.no_serve:
        print(str(logdir), file=out)
        return 0
    command = _tensorboard_command(logdir, args.port, args.host)
    stop = threading.Event()

    def again() -> None:
        while not stop.wait(args.refresh):
            try:
                refresh()
            except ClientError as exc:  # the pod ended: the last copy stays served
                print(f"kubedgx tensorboard: {exc}", file=err)
                return

    if args.refresh > 0 and where.startswith("pod "):
        threading.Thread(target=again, daemon=True).start()
    print(f"serving on http://{args.host}:{args.port}/ (Ctrl-C stops)", file=out)
    out.flush()
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, errors = server.communicate()
    except KeyboardInterrupt:
        server.terminate()
        server.wait(timeout=30)
        return 0
    finally:
        stop.set()
    if server.returncode not in (0, -15):
        said = errors.decode(errors="replace")[-400:]
        print(f"kubedgx tensorboard: tensorboard exited {server.returncode}: {said}", file=err)
        return 1
    return 0


# -- the parser ----------------------------------------------------------------------------------------


def _connection(p: argparse.ArgumentParser, namespace_type: Callable[[str], str]) -> None:
    p.add_argument("-n", "--namespace", type=namespace_type, help="namespace (default: the context's, as kubectl)")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")


def add_parsers(sub: Any, namespace_type: Callable[[str], str]) -> None:
    """The verbs, registered on the ``kubedgx`` (and ``kubectl dgx``) parser."""
    s = sub.add_parser(
        "submit",
        help="create the DGXTrainingJobs (and the DGXDataMounts they use) of YAML files",
        description="Send every document to the cluster as a server dry run first (the webhook judges it with the "
        "cluster's catalog and guard rails: a refusal of any creates none), then create them: DGXDataMounts first "
        "(one that exists is kept), then jobs (one that exists is an error: use another name or generateName). "
        "Prints what it created and how to follow it.",
    )
    s.add_argument("files", nargs="+", metavar="FILE", help="YAML files (multi-document); - for stdin")
    s.add_argument("--dry-run", action="store_true", help="only the server dry run: check, create nothing")
    s.add_argument("-q", "--quiet", action="store_true", help="do not print how to follow the job")
    _connection(s, namespace_type)
    s.set_defaults(func=_guarded(cmd_submit))

    ls = sub.add_parser(
        "list",
        help="the jobs: phase, nodes, step, loss, ETA, restarts, GPU-hours, cost",
        description="One line per DGXTrainingJob. ETA is the steps left at the pace of the current run since it "
        "started; it is '-' after a restart (the resumed run's pace is not known) and when the job is not Running.",
    )
    ls.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace you may list jobs in")
    ls.add_argument(
        "-o",
        "--output",
        choices=["table", "wide", "name", "json", "yaml"],
        default="table",
        help="format: wide adds the reason and the instance; json and yaml give the stored jobs as a List",
    )
    _connection(ls, namespace_type)
    ls.set_defaults(func=_guarded(cmd_list))

    d = sub.add_parser(
        "describe",
        help="a job's conditions (the diagnosis and its fix), workers, data mounts, artifacts and events",
    )
    d.add_argument("job", metavar="JOB", help="the DGXTrainingJob's name")
    d.add_argument(
        "-o",
        "--output",
        choices=["text", "json", "yaml"],
        default="text",
        help="format: json and yaml give the job, its workers, data mounts and events",
    )
    _connection(d, namespace_type)
    d.set_defaults(func=_guarded(cmd_describe))

    lg = sub.add_parser(
        "logs",
        help="a worker's output, progress lines made readable (worker 0 by default)",
        description="Print the trainer container's output of rank 0 (or --rank N, or --all ranks, each line "
        "prefixed with its rank). The trainer's JSON progress lines are shown as readable lines (--raw keeps them "
        "as they are). -f follows across restarts until the job ends.",
    )
    lg.add_argument("job", metavar="JOB", help="the DGXTrainingJob's name")
    lg.add_argument("-f", "--follow", action="store_true", help="follow, across restarts, until the job ends")
    which = lg.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0, metavar="N", help="the worker of this rank (default 0)")
    which.add_argument("--all", action="store_true", help="every worker, each line prefixed with [rank N]")
    lg.add_argument("--tail", type=int, metavar="N", help="only the last N lines (of the first container followed)")
    lg.add_argument("-c", "--container", default=CONTAINER_NAME, help=f"container (default {CONTAINER_NAME})")
    lg.add_argument("--raw", action="store_true", help="the lines as written, JSON progress lines included")
    _connection(lg, namespace_type)
    lg.set_defaults(func=_guarded(cmd_logs))

    w = sub.add_parser(
        "wait",
        help="wait until the job ends: exit 0 if it succeeded, 1 if it failed (with the reason)",
        description="Exit codes: 0 the job succeeded; 1 it failed (its reason and message on stderr); 2 it cannot "
        "be waited for (no such job, deleted meanwhile, the cluster unreachable); 3 --timeout passed first.",
    )
    w.add_argument("job", metavar="JOB", help="the DGXTrainingJob's name")
    w.add_argument("--timeout", type=float, metavar="SECONDS", help="give up after this long (exit 3)")
    _connection(w, namespace_type)
    w.set_defaults(func=_guarded(cmd_wait))

    c = sub.add_parser(
        "cancel",
        help="delete the job: workers stop within their grace period, uploads in flight finish",
        description="Delete the DGXTrainingJob. Its workers get their grace period (the checkpoint sidecar "
        "finishes the upload in flight); what it used stays in its budgets' ledgers. To pause a job instead, "
        'set spec.suspend: true (kubectl patch dgxjob NAME --type merge -p \'{"spec":{"suspend":true}}\').',
    )
    c.add_argument("job", metavar="JOB", help="the DGXTrainingJob's name")
    c.add_argument("--wait", action="store_true", help="return once the job and its workers are gone")
    c.add_argument("--timeout", type=float, metavar="SECONDS", help="with --wait: give up after this long")
    _connection(c, namespace_type)
    c.set_defaults(func=_guarded(cmd_cancel))

    f = sub.add_parser(
        "fetch",
        help="download an artifact of a finished job (the adapter by default) from its Out mount",
        description="Download what status.artifacts lists (adapter, merged, summary, model.tar.gz) into DEST. "
        "The store's credentials: this shell's (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
        "GOOGLE_APPLICATION_CREDENTIALS), else the mount's Secret when you may read it, else the ambient chain. "
        "Needs kubedgx-datasync (pip install 'kubedgx[client]').",
    )
    f.add_argument("job", metavar="JOB", help="the DGXTrainingJob's name")
    f.add_argument("artifact", nargs="?", metavar="ARTIFACT", help="its name in status.artifacts (default: adapter)")
    f.add_argument("-d", "--dest", default=".", metavar="DIR", help="directory to download into (default: .)")
    f.add_argument("--list", action="store_true", help="list the artifacts instead")
    f.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table", help="with --list: format")
    _connection(f, namespace_type)
    f.set_defaults(func=_guarded(cmd_fetch))

    pl = sub.add_parser(
        "plot",
        help="the loss curve: loss, eval loss, learning rate and throughput against step",
        description="Draw the run's progress history (every report, kept in the Out mount by the checkpoint "
        "sidecar, and rank 0's current output) in the terminal, or into a .png or .html file with -o.",
    )
    pl.add_argument("job", nargs="?", metavar="JOB", help="the DGXTrainingJob's name (or --dir)")
    pl.add_argument("-o", "--output", metavar="FILE", help="write FILE.png or FILE.html instead")
    pl.add_argument("--dir", metavar="OUTPUT_DIR", help="a local run's output directory instead of a job")
    pl.add_argument("--width", type=int, help="terminal chart width (default: the terminal's, at most 120)")
    pl.add_argument("--height", type=int, default=12, help="terminal chart height per panel (default 12)")
    _connection(pl, namespace_type)
    pl.set_defaults(func=_guarded(cmd_plot))

    t = sub.add_parser(
        "tensorboard",
        help="serve the job's TensorBoard logs here (from the pod while it runs, from the Out mount after)",
        description="Copy the run's TensorBoard event files (spec.trainer.training.reportTo: tensorboard) out of "
        "rank 0's pod while it trains (kubectl exec, refreshed every --refresh seconds), or from the job's Out "
        "mount once it ended, and run TensorBoard on them on this machine.",
    )
    t.add_argument("job", metavar="JOB", help="the DGXTrainingJob's name")
    t.add_argument("--port", type=int, default=6006, help="port to serve on (default 6006)")
    t.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    t.add_argument("--logdir", metavar="DIR", help="where to put the event files (default: a new temp directory)")
    t.add_argument("--refresh", type=float, default=30.0, metavar="SECONDS", help="copy again this often (default 30)")
    t.add_argument("--from-mount", action="store_true", help="read the Out mount even while the job runs")
    t.add_argument("--no-serve", action="store_true", help="only copy the event files and print the directory")
    _connection(t, namespace_type)
    t.set_defaults(func=_guarded(cmd_tensorboard))


__all__ = ["add_parsers", "describe_text", "list_rows"]
