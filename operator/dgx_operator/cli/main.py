"""The `kubedgx` command, one ``cmd_<verb>`` per verb, wired in :func:`build_parser`.

The user's verbs (validate, render, crds, manifests, instances) need only the base distribution:
they import nothing of the daemon, so `pip install kubedgx && kubedgx validate` in someone else's CI
pulls no kopf, cluster client or object-storage client (tests/unit/test_cli_without_daemon.py).
`run --local` (local.py) needs the trainer extra; the daemon's verbs, `operator` (kopf, the
controllers and the webhook, from runtime/) and `check-install` (installcheck.py), need the
operator extra, import it inside their functions and say which extra is missing when it is.

Exit codes: 0 success, 1 invalid input (each problem on its own line), 2 usage or I/O errors.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from dgx_api import manifests
from dgx_api.schema import Problem
from dgx_api.text import printable
from dgx_operator import __version__
from dgx_operator.api import API_VERSION, DGXDataMount, DGXDataMountSpec, DGXTrainingJob
from dgx_operator.api.common import JOB_KIND, MOUNT_KIND
from dgx_operator.api.crdgen import KINDS
from dgx_operator.api.crdgen import render as render_crd
from dgx_operator.api.limits import KIND as LIMITS_KIND
from dgx_operator.api.limits import DGXLimits
from dgx_operator.catalog import Catalog, CatalogError
from dgx_operator.render import BuildContext, BuildError, Defaults, build_children
from dgx_operator.render.resolved import DEFAULT_TRAINER_IMAGE
from dgx_operator.validation.durability import reference_warnings
from dgx_operator.validation.limits import check as check_limits
from dgx_operator.validation.limits import effective as effective_limits
from dgx_operator.validation.objectmeta import dns1123_label_errors
from dgx_operator.validation.validator import (
    DEFAULT_KUBE_VERSION,
    Validator,
    kube_versions,
    object_label,
    reference_problems,
    without_nulls,
)


class _NoAliasDumper(yaml.SafeDumper):
    """YAML without &anchors/*aliases: what kubectl users expect to read and diff."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, width=120, allow_unicode=True)


@dataclass(frozen=True)
class Document:
    source: str
    index: int
    obj: Any
    #: Where a ``kind: List`` held it: its index in the List's items.
    item: int | None = None

    @property
    def label(self) -> str:
        label = object_label(self.obj)
        return label if self.item is None else f"{label} (List items[{self.item}])"


class InputError(Exception):
    """A file that cannot be read (exit 2: an I/O problem) or parsed (exit 1: invalid input)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _is_list(obj: Any) -> bool:
    """``kind: List`` (or ``<Kind>List``) of ``v1``: kubectl applies its items one by one."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("kind"), str)
        and obj["kind"].endswith("List")
        and obj.get("apiVersion") == "v1"
        and "items" in obj
    )


def read_documents(path: str, stdin: TextIO) -> Iterator[Document]:
    """The objects of one file as kubectl would send them (see :mod:`dgx_api.manifests`): the items
    of a List each on their own, null fields left out as the API server prunes them."""
    source = "<stdin>" if path == "-" else printable(path)
    try:
        data: str | bytes = stdin.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{source}: cannot read: {printable(exc.strerror or str(exc))}", 2) from exc
    except UnicodeDecodeError as exc:  # stdin, decoded by Python
        raise InputError(f"{source}: not UTF-8 text ({exc.reason}): save it as UTF-8", 1) from exc
    try:
        for index, obj in enumerate(manifests.iter_documents(data)):
            if obj is None:
                continue
            if not _is_list(obj):
                yield Document(source, index, without_nulls(obj))
                continue
            items = obj["items"]
            if not isinstance(items, list):
                raise InputError(f"{source}: {object_label(obj)}: items: must be of type array", 1)
            for i, item in enumerate(items):
                yield Document(source, index, without_nulls(item), item=i)
    except manifests.ManifestError as exc:
        raise InputError(f"{source}: {exc}", 1) from exc


def _load_all(paths: Sequence[str], stdin: TextIO, err: TextIO) -> list[Document] | int:
    """All documents of all files, or the exit code when some file could not be loaded."""
    docs: list[Document] = []
    code = 0
    for path in paths:
        try:
            docs.extend(read_documents(path, stdin))
        except InputError as exc:
            print(exc, file=err)
            code = max(code, exc.code)
    return code or docs


def _catalog(path: str | None, err: TextIO) -> Catalog | None:
    try:
        return Catalog.load(path)
    except (OSError, CatalogError) as exc:
        print(printable(f"kubedgx: {exc}"), file=err)
        return None


def _limits(path: str, validator: Validator, stdin: TextIO, err: TextIO) -> dict[str, DGXLimits] | int:
    """The DGXLimits of the file ``--limits`` names, by namespace, or the exit code (2) when it is unusable."""
    loaded = _load_all([path], stdin, err)
    if isinstance(loaded, int):
        return 2
    found: dict[str, DGXLimits] = {}
    for doc in loaded:
        if not isinstance(doc.obj, dict) or doc.obj.get("kind") != LIMITS_KIND:
            continue
        outcome = validator.validate(doc.obj)
        if not outcome.ok:
            for problem in outcome.problems:
                print(f"kubedgx validate: --limits {_line(doc, problem)}", file=err)
            return 2
        limits = DGXLimits.model_validate(doc.obj)
        found[limits.metadata.namespace or "default"] = limits
    if not found:
        print(f"kubedgx validate: --limits {path}: no DGXLimits in it (kind: DGXLimits, apiVersion: {API_VERSION})",
              file=err)  # fmt: skip
        return 2
    return found


def _limit_check(
    job: DGXTrainingJob, given: Mapping[str, DGXLimits], catalog: Catalog
) -> tuple[list[Problem], list[str]]:
    """The webhook's guard-rail check of ``job`` offline: against the DGXLimits of its namespace, or the
    only one given (a job manifest often names no namespace; kubectl picks it when applying)."""
    namespace = job.metadata.namespace
    limits = given.get(namespace or "default")
    if limits is None and len(given) == 1:
        limits = next(iter(given.values()))
    if limits is None:
        return [], []
    return check_limits(job, effective_limits(None, limits, namespace or limits.metadata.namespace), catalog)


def _line(doc: Document, problem: Problem) -> str:
    return f"{doc.source}: {doc.label}: {problem}"


# --------------------------------------------------------------------------------------------


def _inputs(args: argparse.Namespace, err: TextIO, stdin: TextIO) -> tuple[Validator, list[Document]] | int:
    """The validator and every document of the given files, or the exit code if either failed."""
    catalog = _catalog(args.catalog, err)
    docs = _load_all(args.files, stdin, err)
    if catalog is None:
        return 2
    if isinstance(docs, int):
        return docs
    return Validator(catalog, args.kube_version), docs


def cmd_validate(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    loaded = _inputs(args, err, stdin)
    if isinstance(loaded, int):
        return loaded
    validator, docs = loaded
    invalid: set[int] = set()
    for i, doc in enumerate(docs):
        outcome = validator.validate(doc.obj)
        for problem in outcome.problems:
            print(_line(doc, problem), file=out)
        for note in outcome.notes:
            print(f"{doc.source}: {doc.label}: note: {printable(note)}", file=err)
        if not outcome.ok:
            invalid.add(i)
    valid = [(doc.obj, i) for i, doc in enumerate(docs) if i not in invalid]
    for i, problem in reference_problems(validator.catalog, valid):
        print(_line(docs[i], problem), file=out)
        invalid.add(i)
    limit_warnings: list[tuple[int, str]] = []
    if getattr(args, "limits", None) is not None:
        given = _limits(args.limits, validator, stdin, err)
        if isinstance(given, int):
            return given
        for i, doc in enumerate(docs):
            if i in invalid or not isinstance(doc.obj, dict) or doc.obj.get("kind") != JOB_KIND:
                continue
            if doc.obj.get("apiVersion") != API_VERSION:
                continue
            problems, warned = _limit_check(DGXTrainingJob.model_validate(doc.obj), given, validator.catalog)
            for problem in problems:
                print(_line(doc, problem), file=out)
                invalid.add(i)
            limit_warnings += [(i, w) for w in warned]
    # Warnings, as kubectl prints the webhook's: on stderr, the exit code unchanged, -q or not (a
    # warning says something about the job; -q only drops the summary).
    sound = [(doc.obj, i) for i, doc in enumerate(docs) if i not in invalid]
    for i, warning in [*limit_warnings, *reference_warnings(validator.catalog, sound)]:
        print(f"{docs[i].source}: {docs[i].label}: warning: {warning}", file=err)
    if not args.quiet:
        summary = f"{len(docs)} object(s) checked, {len(invalid)} invalid" if docs else "no objects found"
        print(summary, file=err)
    return 1 if invalid or not docs else 0


def cmd_render(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    loaded = _inputs(args, err, stdin)
    if isinstance(loaded, int):
        return loaded
    validator, docs = loaded
    catalog = validator.catalog
    bad = False
    mounts: dict[tuple[str, str], DGXDataMountSpec] = {}
    jobs: list[tuple[Document, DGXTrainingJob]] = []
    for doc in docs:
        if not isinstance(doc.obj, dict) or doc.obj.get("apiVersion") != API_VERSION:
            continue
        outcome = validator.validate(doc.obj)
        if not outcome.ok:
            bad = True
            for p in outcome.problems:
                print(_line(doc, p), file=err)
            continue
        if doc.obj["kind"] == MOUNT_KIND:
            mount = DGXDataMount.model_validate(doc.obj)
            mounts[(args.namespace or mount.metadata.namespace or "default", mount.metadata.name)] = mount.spec
        else:
            jobs.append((doc, DGXTrainingJob.model_validate(doc.obj)))
    if bad:
        return 1
    if not jobs:
        print("kubedgx render: no DGXTrainingJob in the input", file=err)
        return 1
    defaults = Defaults(trainer_image=args.image)
    chunks: list[str] = []
    for doc, job in jobs:
        ns = args.namespace or job.metadata.namespace or "default"
        ctx = BuildContext(
            catalog=catalog,
            defaults=defaults,
            data_mounts={name: spec for (mns, name), spec in mounts.items() if mns == ns},
        )
        try:
            children = build_children(job, ctx, namespace=ns, uid=args.uid)
        except BuildError as exc:
            print(_line(doc, Problem(exc.path, exc.message)), file=err)
            bad = True
            continue
        kinds = ", ".join(
            f"{sum(c['kind'] == k for c in children)} {k}" for k in dict.fromkeys(c["kind"] for c in children)
        )
        header = f"# {job.kind} {ns}/{job.metadata.name}: {kinds}"
        if not (args.uid or job.metadata.uid):
            header += (
                "\n# ownerReferences[].uid and PET_RDZV_ID use a placeholder; the operator uses the job's metadata.uid"
            )
        chunks.append(header + "\n" + "---\n".join(dump_yaml(c) for c in children))
    if bad:
        return 1
    out.write("---\n".join(chunks))
    return 0


def cmd_crds(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    out.write("---\n".join(render_crd(k) for k in KINDS))
    return 0


def cmd_manifests(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    """What the chart installs that jobs cannot run without, for a cluster set up without Helm: the
    CRDs, and the PriorityClasses that workers name (without them the apiserver refuses the workers)."""
    from dgx_operator.runtime.priorities import priority_class_manifests

    docs = [render_crd(k) for k in KINDS] + [dump_yaml(pc) for pc in priority_class_manifests()]
    out.write("---\n".join(docs))
    return 0


def cmd_instances(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    catalog = _catalog(args.catalog, err)
    if catalog is None:
        return 2
    pricing = catalog.spec.pricing
    header: tuple[str, ...] = ("INSTANCE", "GPU", "GPUS", "GPU MEM", "CPU", "MEMORY", "NVLINK DOMAIN")
    if pricing is not None:
        header += (f"{pricing.currency}/GPU-H", f"{pricing.currency}/WORKER-H")
    rows = [header]
    for inst in catalog.instances.values():
        domain = f"{inst.family.nvlink_domain_nodes} nodes" if inst.multi_node_nvlink else "node"
        row: tuple[str, ...] = (
            inst.name,
            inst.products[0],
            str(inst.gpus) if inst.mig is None else f"MIG {inst.mig.profile}",
            f"{inst.gpu_memory_gib}GiB",
            inst.cpu,
            inst.memory,
            domain,
        )
        if pricing is not None:  # "-": a family or pool the prices leave out (never 0)
            row += tuple("-" if p is None else f"{p:.2f}" for p in (inst.price_per_gpu_hour, inst.price_per_node_hour))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
    if pricing is not None and pricing.examples:
        # On stderr: the table stays a table for whoever pipes it.
        print(
            f"kubedgx instances: the prices are the catalog's examples, not this cluster's ({pricing.currency} per "
            "hour, all-in): an admin sets catalog.pricing and examples: false",
            file=err,
        )
    return 0


def cmd_usage(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    """GPU-hours, cost and spot savings per namespace and per job over a period (cli/report.py):
    read with the user's kubeconfig (client/kubeclient.py, the standard library only, so the verb runs
    without the daemon's dependencies), built and formatted by pure code. The notes (where a total
    comes from, what it leaves out, example prices) go to stderr, so the table, JSON or CSV stays
    clean for whoever pipes it."""
    from dgx_operator.cli import report
    from dgx_operator.client import kubeclient

    try:
        client = kubeclient.load(args.kubeconfig, args.context)
        now = report.now()
        period = report.resolve(args.period, now)
        found = report.read(
            client,
            namespace=args.namespace,
            all_namespaces=args.all_namespaces,
            team=args.team_label,
            queue=args.queue,
        )
    except kubeclient.ClusterError as exc:
        print(printable(f"kubedgx usage: {exc}"), file=err)
        return 2
    built = report.build(period, found.jobs, found.budgets, found.namespaces, now, queue=args.queue)
    out.write(report.RENDERERS[args.output](built))
    for note in built.notes:
        print(printable(f"kubedgx usage: note: {note}"), file=err)
    return 0


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    """Run a job's fine-tune here (--local); to run it on a cluster, kubectl apply it."""
    from dgx_operator.cli import local

    if not args.local:
        print("kubedgx run: only --local is supported; on a cluster, `kubectl apply -f` the manifest", file=err)
        return 2
    loaded = _inputs(args, err, stdin)
    if isinstance(loaded, int):
        return loaded
    validator, docs = loaded
    jobs = []
    for doc in docs:
        if isinstance(doc.obj, dict) and doc.obj.get("kind") == JOB_KIND:
            outcome = validator.validate(doc.obj)
            if not outcome.ok:
                for problem in outcome.problems:
                    print(_line(doc, problem), file=err)
                return 1
            jobs.append(DGXTrainingJob.model_validate(doc.obj))
    try:
        job = local.pick_job(jobs, args.job)
        plan = local.plan(job, Path(args.files[0]), validator.catalog, nproc=args.nproc, output=args.output)
        return local.execute(plan, out, err)
    except local.LocalRunError as exc:
        print(f"kubedgx run: {exc}", file=err)
        return 2


#: `kubedgx operator` flags -> the variables they override (flags win over the environment).
OPERATOR_FLAGS = {
    "catalog": "KUBEDGX_CATALOG",
    "limits": "KUBEDGX_LIMITS",
    "trainer_image": "KUBEDGX_TRAINER_IMAGE",
    "datasync_image": "KUBEDGX_DATASYNC_IMAGE",
    "cache_root": "KUBEDGX_CACHE_ROOT",
    "scheduler_name": "KUBEDGX_SCHEDULER_NAME",
    "priority_classes": "KUBEDGX_PRIORITY_CLASSES",
    "image_pull_policy": "KUBEDGX_IMAGE_PULL_POLICY",
    "metrics_port": "KUBEDGX_METRICS_PORT",
    "health_port": "KUBEDGX_HEALTH_PORT",
    "webhook_port": "KUBEDGX_WEBHOOK_PORT",
    "webhook_service": "KUBEDGX_WEBHOOK_SERVICE",
    "webhook_namespace": "KUBEDGX_WEBHOOK_NAMESPACE",
    "webhook_configuration": "KUBEDGX_WEBHOOK_CONFIGURATION",
    "webhook_failure_policy": "KUBEDGX_WEBHOOK_FAILURE_POLICY",
    "ca_bundle": "KUBEDGX_CA_BUNDLE",
    "webhook_secret": "KUBEDGX_WEBHOOK_SECRET",
    "webhook_timeout_seconds": "KUBEDGX_WEBHOOK_TIMEOUT_SECONDS",
    "webhook_dry_run": "KUBEDGX_WEBHOOK_DRY_RUN",
    "bind_address": "KUBEDGX_BIND_ADDRESS",
    "shutdown_delay": "KUBEDGX_SHUTDOWN_DELAY",
    "progress_interval": "KUBEDGX_PROGRESS_INTERVAL",
    "status_interval": "KUBEDGX_STATUS_INTERVAL",
    "usage_interval": "KUBEDGX_USAGE_INTERVAL",
    "leader_elect": "KUBEDGX_LEADER_ELECTION",
    "leader_election_namespace": "KUBEDGX_LEADER_ELECTION_NAMESPACE",
    "leader_election_id": "KUBEDGX_LEADER_ELECTION_ID",
    "leader_election_lease_duration": "KUBEDGX_LEADER_ELECTION_LEASE_DURATION",
    "leader_election_renew_deadline": "KUBEDGX_LEADER_ELECTION_RENEW_DEADLINE",
    "leader_election_retry_period": "KUBEDGX_LEADER_ELECTION_RETRY_PERIOD",
}
WEBHOOK_MODE_VARIABLES = (
    "KUBEDGX_WEBHOOK_CERT",
    "KUBEDGX_WEBHOOK_KEY",
    "KUBEDGX_WEBHOOK_SELF_SIGNED",
    "KUBEDGX_WEBHOOK_INSECURE",
)


def operator_environment(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with the flags given written over it: one parser checks both."""
    env = dict(environ)
    for flag, variable in OPERATOR_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            env[variable] = str(value)
    if args.namespace:
        env["KUBEDGX_WATCH_NAMESPACES"] = ",".join(args.namespace)
    elif args.all_namespaces:
        env["KUBEDGX_WATCH_NAMESPACES"] = ""
    if args.webhook_cert or args.webhook_key or args.webhook_self_signed or args.webhook_insecure:
        # A mode chosen by flags replaces the environment's, whichever it was.
        for variable in WEBHOOK_MODE_VARIABLES:
            env[variable] = ""
        env["KUBEDGX_WEBHOOK_CERT"] = args.webhook_cert or ""
        env["KUBEDGX_WEBHOOK_KEY"] = args.webhook_key or ""
        env["KUBEDGX_WEBHOOK_SELF_SIGNED"] = "1" if args.webhook_self_signed else ""
        env["KUBEDGX_WEBHOOK_INSECURE"] = "1" if args.webhook_insecure else ""
    return env


#: What the daemon's verbs (operator, check-install) import beyond the CLI's own dependencies: the
#: distributions of the ``operator`` extra. ``pip install kubedgx`` (validate, render, crds, ...) in
#: someone else's CI pulls none of them.
DAEMON_MODULES = ("kopf", "kubernetes_asyncio", "aiohttp", "prometheus_client", "cryptography", "dgx_datasync")


def missing_daemon_modules(verb: str, err: TextIO) -> bool:
    """Whether a daemon verb cannot run here: then it says which module is missing and how to get
    it, instead of a traceback from deep inside an import."""
    import importlib.util

    missing = [m for m in DAEMON_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"kubedgx {verb}: needs the operator's dependencies, and {', '.join(missing)} is not installed: "
            "pip install 'kubedgx[operator]' (the operator image has them)",
            file=err,
        )
    return bool(missing)


def keep_out_generated_client() -> None:
    """Keep kubernetes_asyncio out of the daemon's process. kopf imports it whenever it is
    installed, and with it every generated API model class (some 40 MB, a fifth of the operator's
    peak memory at 1,000 jobs), only to recognise that library's objects in helpers the operator
    never calls; the operator's own client (kube.py) speaks plain JSON over aiohttp. The library is
    still installed for `kubedgx check-install`'s kubeconfig loader (exec plugins), and beside the
    operator wherever the Flyte plugin is. A ``None`` in ``sys.modules`` makes an import of it
    raise ImportError, which kopf expects when it is absent."""
    import sys

    if "kubernetes_asyncio" not in sys.modules:
        sys.modules["kubernetes_asyncio"] = None  # type: ignore[assignment]


def cmd_operator(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    """Run the kopf operator. kopf is imported here only, so validate/render stay light."""
    import os

    if missing_daemon_modules("operator", err):
        return 2
    keep_out_generated_client()

    import kopf

    from dgx_operator.runtime.settings import ConfigError, OperatorConfig

    try:
        config = OperatorConfig.from_env(operator_environment(args, os.environ))
        config.catalog()
    except ConfigError as exc:
        print(f"kubedgx operator: {exc}", file=err)
        return 2
    except (OSError, CatalogError) as exc:
        print(f"kubedgx operator: KUBEDGX_CATALOG: {exc}", file=err)
        return 2
    # After the settings are checked: importing the handlers reads KUBEDGX_KUEUE, which would
    # otherwise refuse a bad value with a traceback instead of the one line above.
    from dgx_operator.runtime import handlers  # noqa: F401  (registers the handlers with kopf)

    if config.webhook is not None:
        from dgx_operator.runtime import webhooks  # noqa: F401  (registers the validating webhook)
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    from dgx_operator.runtime import daemon as runtime

    runtime.run(config, standalone=args.standalone, peering_name=args.peering, liveness=args.liveness)
    return 0


def cmd_check_install(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    """Check an installation from inside the cluster (the chart's `helm test` hook runs this):
    dgx_operator.cli.installcheck says what each check exercises. The cluster client is imported here
    only, as kopf is for `operator`."""
    import asyncio

    if missing_daemon_modules("check-install", err):
        return 2
    from dgx_operator.cli import installcheck

    namespace = args.namespace or installcheck.own_namespace() or "default"
    return asyncio.run(
        installcheck.run_checks(namespace, args.catalog, webhook=args.webhook, timeout=args.timeout, out=out)
    )


def _kube_version(text: str) -> str:
    """A Kubernetes minor version whose schemas kubernetes-validate ships."""
    known = kube_versions()
    match = re.fullmatch(r"v?(\d+)\.(\d+)(\.\d+)?", text)
    if match is None or f"{int(match[1])}.{int(match[2])}" not in known:
        shown = f"{known[0]} to {known[-1]}" if known else "none installed"
        raise argparse.ArgumentTypeError(
            f"{printable(text)!r} is not a Kubernetes version it knows: give X.Y ({shown})"
        )
    return text


def _namespace(text: str) -> str:
    errors = dns1123_label_errors(text)
    if errors:
        raise argparse.ArgumentTypeError(f"invalid namespace {printable(text)!r}: {errors[0]}")
    return text


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser raising ValueError: argparse then names the option, prints the
    message and exits 2 (never a traceback)."""

    def check(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(printable(str(exc))) from None

    check.__name__ = parse.__name__
    return check


def build_parser(prog: str = "kubedgx") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="kubedgx: GPU training on DGX-class Kubernetes nodes. Submit, follow and fetch "
        "DGXTrainingJobs; validate and render their manifests; run the fine-tune on this machine.",
    )
    parser.add_argument("--version", action="version", version=f"kubedgx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--catalog", metavar="FILE", help="instance catalog YAML (default: the built-in one)")
        p.add_argument(
            "--kube-version",
            type=_kube_version,
            default=DEFAULT_KUBE_VERSION,
            metavar="X.Y",
            help=f"Kubernetes version whose schemas built-in kinds are checked against "
            f"(default {DEFAULT_KUBE_VERSION})",
        )

    v = sub.add_parser(
        "validate",
        help="check manifests against the CRDs, their CEL rules and the catalog",
        description="Check every DGXTrainingJob and DGXDataMount against the generated CRD schema, "
        "its CEL rules and the instance catalog, and every other object against the official "
        "Kubernetes schemas. Prints one line per problem; exits 1 if any.",
    )
    v.add_argument("files", nargs="+", metavar="FILE", help="YAML files (multi-document); - for stdin")
    v.add_argument("-q", "--quiet", action="store_true", help="no summary line")
    v.add_argument(
        "--limits",
        metavar="FILE",
        help="a DGXLimits manifest: check each job against it as the webhook would (the DGXLimits of the job's "
        "namespace, or the only one given); its defaults are printed as warnings",
    )
    common(v)
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser(
        "render",
        help="print the objects the operator would create for each DGXTrainingJob",
        description="Print, as multi-document YAML, exactly what the operator creates when each "
        "DGXTrainingJob starts. DGXDataMounts that jobs reference must be in the input too.",
    )
    r.add_argument("files", nargs="+", metavar="FILE", help="YAML files (multi-document); - for stdin")
    r.add_argument("-n", "--namespace", type=_namespace, help="namespace (default: the manifest's, else 'default')")
    r.add_argument("--image", default=DEFAULT_TRAINER_IMAGE, help="default trainer image (the chart's value)")
    r.add_argument("--uid", help="job UID to use instead of a placeholder")
    common(r)
    r.set_defaults(func=cmd_render)

    c = sub.add_parser("crds", help="print the CustomResourceDefinitions (kubectl apply -f -)")
    c.set_defaults(func=cmd_crds)

    m = sub.add_parser(
        "manifests",
        help="print what the chart installs cluster-wide: the CRDs and the workers' PriorityClasses",
        description="Print the CustomResourceDefinitions and the three PriorityClasses (kubedgx-low, "
        "kubedgx-normal, kubedgx-high, as the Helm chart creates them) for a cluster set up without Helm: "
        "kubedgx manifests | kubectl apply -f -",
    )
    m.set_defaults(func=cmd_manifests)

    run = sub.add_parser(
        "run",
        help="run a DGXTrainingJob's fine-tune on this machine (--local)",
        description="Run the job's spec.trainer on this machine under torchrun, as one node: its processes per "
        "node capped to the GPUs (or CPU cores) present, its torchrun restart budget. Relative paths resolve "
        "against the manifest's directory.",
    )
    run.add_argument("files", nargs=1, metavar="FILE", help="the job's manifest (YAML)")
    run.add_argument("--local", action="store_true", help="run here (required: on a cluster, kubectl apply)")
    run.add_argument("--nproc", type=int, help="processes (default: the job's nprocPerNode, capped)")
    run.add_argument("--output", type=Path, help="output directory (default: ./kubedgx-runs/<job>)")
    run.add_argument("--job", help="which DGXTrainingJob, when the file holds several")
    common(run)
    run.set_defaults(func=cmd_run)

    o = sub.add_parser(
        "operator",
        help="run the operator (in the cluster, or locally against your kubeconfig)",
        description="Run the kubedgx operator: reconcile DGXTrainingJobs into worker pods and serve the "
        "validating webhook. Settings also come from KUBEDGX_* variables (see the Helm chart).",
    )
    scope = o.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        metavar="NS",
        help="watch this namespace (repeatable; default: $KUBEDGX_WATCH_NAMESPACES, comma-separated, else all)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    o.add_argument("--catalog", metavar="FILE", help="instance catalog YAML (default: $KUBEDGX_CATALOG or built-in)")
    o.add_argument(
        "--limits", metavar="FILE", help="cluster-wide guard rails, YAML of a DGXLimits spec ($KUBEDGX_LIMITS)"
    )
    o.add_argument("--trainer-image", help="default trainer image ($KUBEDGX_TRAINER_IMAGE)")
    o.add_argument(
        "--scheduler-name", help="workers' spec.schedulerName, a kube-scheduler profile ($KUBEDGX_SCHEDULER_NAME)"
    )
    o.add_argument("--datasync-image", help="data sync containers' image ($KUBEDGX_DATASYNC_IMAGE; default: trainer's)")
    o.add_argument("--cache-root", metavar="PATH", help="node-local data cache ($KUBEDGX_CACHE_ROOT; /raid/kubedgx)")
    o.add_argument(
        "--priority-classes",
        metavar="MAP",
        help="low=CLASS,normal=CLASS,high=CLASS; '' for none ($KUBEDGX_PRIORITY_CLASSES; kubedgx-low,...)",
    )
    o.add_argument(
        "--image-pull-policy",
        choices=("Always", "IfNotPresent", "Never"),
        help="workers' imagePullPolicy ($KUBEDGX_IMAGE_PULL_POLICY; IfNotPresent)",
    )
    o.add_argument("--metrics-port", type=int, metavar="N", help="Prometheus /metrics port, 0: off (8080)")
    o.add_argument("--health-port", type=int, metavar="N", help="liveness/readiness /healthz port, 0: off (8081)")
    o.add_argument("--liveness", metavar="URL", help="kopf's liveness endpoint URL (overrides --health-port)")
    o.add_argument("--standalone", action="store_true", help="no peering: never pause for other operators")
    o.add_argument("--peering", metavar="NAME", default=None, help="kopf peering object to coordinate through")
    o.add_argument("--log-format", choices=("plain", "json"), default="plain", help="structured logs with json")
    o.add_argument("--verbose", action="store_true", help="debug logging")
    o.add_argument("--webhook-port", type=int, metavar="N", help="serve the validating webhook on this port")
    mode = o.add_mutually_exclusive_group()
    mode.add_argument("--webhook-self-signed", action="store_true", help="make a CA and certificate, register them")
    mode.add_argument("--webhook-insecure", action="store_true", help="serve the webhook over plain HTTP")
    mode.add_argument("--webhook-cert", metavar="FILE", help="the webhook's TLS certificate (with --webhook-key)")
    o.add_argument("--webhook-key", metavar="FILE", help="the webhook's TLS key")
    o.add_argument("--webhook-service", metavar="NAME", help="the webhook's Service (self-signed mode)")
    o.add_argument("--webhook-namespace", metavar="NS", help="the Service's namespace (default: the operator's)")
    o.add_argument("--webhook-configuration", metavar="NAME", help="ValidatingWebhookConfiguration to manage (kubedgx)")
    o.add_argument("--webhook-failure-policy", choices=("Fail", "Ignore"), help="its failurePolicy (Fail)")
    o.add_argument(
        "--webhook-dry-run",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dry-run a job's children against the apiserver at admission (on)",
    )
    o.add_argument("--ca-bundle", metavar="FILE", help="PEM of object stores' private CAs, added to the default trust")
    o.add_argument("--webhook-secret", metavar="NAME", help="self-signed: the Secret sharing the pair (<service>-tls)")
    o.add_argument("--webhook-timeout-seconds", type=int, metavar="N", help="the configuration's timeoutSeconds (10)")
    o.add_argument("--bind-address", metavar="IP", help="address of the health, metrics and webhook servers (0.0.0.0)")
    o.add_argument(
        "--shutdown-delay",
        metavar="DURATION",
        help="after SIGTERM, keep answering admission reviews this long before stopping (0s)",
    )
    o.add_argument(
        "--progress-interval",
        metavar="DURATION",
        help="how often a running job's worker 0 log is read for its progress (30s; 0: never)",
    )
    o.add_argument(
        "--status-interval",
        metavar="DURATION",
        help="how long a job's status may lag behind its running-worker counts (10s; 0: written at once)",
    )
    o.add_argument(
        "--usage-interval",
        metavar="DURATION",
        help="how long a running job's status.usage may lag behind (5m; 0: like the worker counts)",
    )
    o.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="elect one replica on a Lease to reconcile; every replica serves admission (off)",
    )
    o.add_argument("--leader-election-namespace", metavar="NS", help="the Lease's namespace (the operator's)")
    o.add_argument("--leader-election-id", metavar="NAME", help="the Lease's name (kubedgx-operator)")
    o.add_argument("--leader-election-lease-duration", metavar="DURATION", help="how long a Lease lasts (15s)")
    o.add_argument("--leader-election-renew-deadline", metavar="DURATION", help="leader gives up after (10s)")
    o.add_argument("--leader-election-retry-period", metavar="DURATION", help="between attempts (2s)")
    o.set_defaults(func=cmd_operator)

    ci = sub.add_parser(
        "check-install",
        help="check an installation from inside the cluster (the Helm chart's test: helm test <release>)",
        description="Check that the apiserver serves the CRDs, that the catalog loads, that a valid "
        "DGXTrainingJob is accepted and (with the webhook) that the validating webhook refuses one whose "
        "instance type the catalog lacks. Every create is a server-side dry run: nothing is stored. One "
        "line per check; exits 1 if one failed, 2 if no client of the cluster can be configured.",
    )
    ci.add_argument(
        "-n", "--namespace", type=_namespace, help="where to dry-run the jobs (default: this pod's, else default)"
    )
    ci.add_argument(
        "--catalog", metavar="FILE", help="the installed catalog (the chart's ConfigMap; default: built-in)"
    )
    ci.add_argument(
        "--webhook",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="expect the validating webhook to answer (on)",
    )
    ci.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="keep retrying calls the apiserver answers with a 5xx (a webhook not reachable yet) this long (60)",
    )
    ci.set_defaults(func=cmd_check_install)

    from dgx_operator.cli import report

    u = sub.add_parser(
        "usage",
        help="GPU-hours, cost and spot savings per namespace and per job over a period",
        description="Report what the jobs used over a period, from the DGXTrainingJobs' status.usage and the "
        "DGXBudgets' ledgers, read with your kubeconfig (RBAC decides what you see). A namespace's total comes "
        "from a DGXBudget counting all its jobs for that period when there is one (deleted jobs included), else "
        "from its live jobs; the notes on stderr say which and what it leaves out (docs/cost.md, The report).",
    )
    where = u.add_mutually_exclusive_group()
    where.add_argument(
        "-n", "--namespace", type=_namespace, help="this namespace (default: the kubeconfig context's, as kubectl)"
    )
    where.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace you may list jobs in")
    where.add_argument(
        "--team-label",
        type=_checked(report.parse_label),
        metavar="KEY=VALUE",
        help="the namespaces with this label: a team (lists namespaces, which needs a ClusterRole)",
    )
    u.add_argument(
        "--queue",
        type=_checked(report.parse_queue),
        metavar="Q",
        help="only jobs of this Kueue LocalQueue (their kueue.x-k8s.io/queue-name label)",
    )
    u.add_argument(
        "--period",
        type=_checked(report.parse_period),
        default=report.parse_period("this-month"),
        metavar="PERIOD",
        help=f"{report.PERIOD_HELP}; months and dates in UTC (default: this-month)",
    )
    u.add_argument("-o", "--output", choices=sorted(report.RENDERERS), default="table", help="format (table)")
    u.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    u.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")
    u.set_defaults(func=cmd_usage)

    from dgx_operator.cli import jobs

    jobs.add_parsers(sub, _namespace)

    i = sub.add_parser("instances", help="list the instance types of the catalog")
    i.add_argument("--catalog", metavar="FILE", help="instance catalog YAML (default: the built-in one)")
    i.set_defaults(func=cmd_instances)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
    prog: str = "kubedgx",
) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    code: int = args.func(args, out or sys.stdout, err or sys.stderr, stdin or sys.stdin)
    return code


def kubectl_main() -> int:
    """``kubectl dgx ...``: kubectl finds the ``kubectl-dgx`` executable on PATH (krew's convention)
    and runs it with the rest of the command line; the verbs are kubedgx's."""
    return main(prog="kubectl dgx")


if __name__ == "__main__":
    raise SystemExit(main())
