"""Fixtures for integration tests: an in-memory Kubernetes API (emulator.py) and kopf operators run against it.

Fixture API
-----------
``emulator``
    An :class:`~tests.integration.emulator.Emulator` serving HTTP on 127.0.0.1 (a free port; ``emulator.url``),
    with crds/*.yaml installed and the namespaces default, kube-system, kube-public and ``ml`` created.
    Direct helpers: ``create``, ``get``, ``select``, ``patch``, ``patch_status``, ``delete``,
    ``finish_pod_deletion``, ``wait_for``/``wait_for_object``/``wait_for_absence``; test controls: ``fail``
    (fault injection), ``log``/``calls`` (the request log), ``drop_watches``, ``compact``, ``admission``,
    ``hold_pod_deletion``. Teardown ends open watch streams, stops the server, and fails the test if the
    emulator itself raised (kmock's strict mode).
``kubeconfig``
    The path of a kubeconfig pointing at the emulator; ``KUBECONFIG`` is set to it for the test.
``api_client``
    A ``kubernetes_asyncio.client.ApiClient`` configured from that kubeconfig.
``kubes``
    Makes the operator's own clients (``dgx_operator.kube.Kube``) of the emulator.
``http``
    A plain ``aiohttp.ClientSession`` on the emulator's URL, for raw HTTP (``await http.get("/api/v1")``).
``run_operator``
    ``await run_operator("pkg.module", namespaces=("ml",), wait_for=("dgxtrainingjobs", "pods"))`` imports the
    module and runs its kopf handlers in this event loop, standalone (no peering), until the test ends;
    ``wait_for`` names resources whose watch streams must be open before it returns (without it, it returns
    at once; kopf lists what exists when its watches start anyway). Returns an
    :class:`OperatorRun` (``await run.stop()`` stops it early and re-raises an operator crash).
``webhook``
    The operator with its validating webhook served over plain HTTP on a free loopback port, once the server
    listens: an :class:`~tests.integration.admission_helpers.Webhook` (``post``, ``allowed``, ``refused``).

The operator module logs in through a ``@kopf.on.login()`` handler reading the kubeconfig, e.g.::

    @kopf.on.login()
    def login(**kwargs):
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

(kopf's implicit login fallbacks look at KUBECONFIG as it was when kopf was imported). A module-level
``registry = kopf.OperatorRegistry()`` is used if the module has one, kopf's default registry otherwise.

How it runs: ``kopf.spawn_tasks(standalone=True, namespaces=...)`` + ``kopf.run_tasks(ignored=...)`` in a task
of the test's loop, stopped by its stop flag at teardown. ``ignored`` lets kopf cancel only tasks running
kopf's code at exit (by default it cancels every newer task, pytest-asyncio's teardown and the emulator's
connections included); SIGINT/SIGTERM go back to pytest. Settings: kopf's defaults except
``networking.error_backoffs = (0.1, 0.2, 0.5, 1.0)``; pass ``configure=lambda settings: ...`` for more. Mind
kopf's 60 s default retry delay of a failing handler: give handlers a ``backoff=`` a test can wait for.

Tests are async: put ``pytestmark = pytest.mark.asyncio`` in the module (pytest-asyncio runs in strict mode
here, and pyproject.toml is not changed for it). Every test in this directory gets a 60 s timeout unless it
sets its own. Example::

    async def test_job_gets_a_running_worker(emulator, run_operator):
        await run_operator("dgx_operator.runtime.handlers", wait_for=("dgxtrainingjobs", "pods"))
        emulator.create("dgxtrainingjobs", job, namespace="ml")
        await emulator.wait_for_object("pods", "ml", "job-worker-0")
        emulator.patch_status("pods", "ml", "job-worker-0", {"phase": "Running"})
        await emulator.wait_for_object("dgxtrainingjobs", "ml", "job", lambda j: j["status"]["phase"] == "Running")
        assert not emulator.calls(succeeded=False)  # no 409 or 422 on the way
"""

from __future__ import annotations

import asyncio
import importlib
import signal
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client, config

from dgx_operator.kube import Kube
from dgx_operator.runtime.settings import OperatorConfig
from dgx_operator.webhook import admission
from dgx_operator.webhook.config import WebhookConfig
from tests.conftest import CRDS
from tests.integration.admission_helpers import READY_TIMEOUT_S, Webhook, operator_registry
from tests.integration.emulator import Emulator
from tests.support.ports import free_port

TEST_TIMEOUT_S = 60
_KOPF_DIR = str(Path(kopf.__file__).parent)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A hard 60 s ceiling per integration test (pyproject's global timeout is 300 s)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@pytest_asyncio.fixture
async def emulator() -> AsyncIterator[Emulator]:
    async with Emulator(strict=True) as api, kmock.Server(api):
        api.install_crds(sorted(CRDS.glob("*.yaml")))
        api.create_namespace("ml")
        yield api
        api.drop_watches()


@pytest.fixture
def kubeconfig(emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "kubeconfig.yaml"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": str(emulator.url).rstrip("/")}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator", "namespace": "ml"}}],
        "current-context": "emulator",
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


@pytest_asyncio.fixture
async def api_client(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api


#: What ``kubes`` hands a test.
Kubes = Callable[[], Awaitable[Kube]]


@pytest_asyncio.fixture
async def kubes(kubeconfig: Path) -> AsyncIterator[Kubes]:
    """Makes the operator's own clients (dgx_operator.kube) of the emulator, as many as a test asks
    for (one per replica it plays), each closed at the end."""
    made: list[Kube] = []

    async def make() -> Kube:
        made.append(await Kube.connect())
        return made[-1]

    yield make
    for kube in made:
        await kube.close()


@pytest_asyncio.fixture
async def http(emulator: Emulator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=str(emulator.url)) as session:
        yield session


class _Bystanders(Collection["asyncio.Task[Any]"]):
    """The tasks kopf must leave alone when it stops: those that are not kopf's.

    At exit, kopf cancels every task that did not exist when it started, taking them all for its own. In a
    test, the emulator's server starts tasks per connection and request, and pytest-asyncio runs each fixture
    teardown in a new task; cancelling those breaks the test. So kopf may stop only tasks running its code.
    """

    def __init__(self, before: Iterable[asyncio.Task[Any]]) -> None:
        self._before = set(before)

    def __contains__(self, task: object) -> bool:
        if task in self._before or not isinstance(task, asyncio.Task):
            return True
        code = getattr(task.get_coro(), "cr_code", None)
        return code is None or not code.co_filename.startswith(_KOPF_DIR)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(self._before)

    def __len__(self) -> int:
        return len(self._before)


@dataclass
class OperatorRun:
    """A kopf operator running in the test's event loop."""

    module: ModuleType
    settings: kopf.OperatorSettings
    task: asyncio.Task[None]
    stop_flag: asyncio.Event

    async def stop(self, timeout: float = 15.0) -> None:
        """Stop the operator; re-raises what made it crash, if it did."""
        self.stop_flag.set()
        async with asyncio.timeout(timeout):
            await self.task


RunOperator = Callable[..., Awaitable[OperatorRun]]


@pytest_asyncio.fixture
async def run_operator(emulator: Emulator, kubeconfig: Path) -> AsyncIterator[RunOperator]:
    runs: list[OperatorRun] = []

    async def start(
        module: str | ModuleType,
        *,
        namespaces: Collection[str] = ("ml",),
        clusterwide: bool = False,
        wait_for: Collection[str] = (),
        configure: Callable[[kopf.OperatorSettings], None] | None = None,
        memo: kopf.Memo | None = None,
        timeout: float = 10.0,
    ) -> OperatorRun:
        module = importlib.import_module(module) if isinstance(module, str) else module
        registry = getattr(module, "registry", None) or kopf.get_default_registry()
        settings = kopf.OperatorSettings()
        settings.networking.error_backoffs = (0.1, 0.2, 0.5, 1.0)  # kopf's (1, 1, 2, 3, ...) slow tests down
        if configure is not None:
            configure(settings)
        stop_flag = asyncio.Event()
        before = asyncio.all_tasks()

        async def operate() -> None:
            tasks = await kopf.spawn_tasks(
                registry=registry,
                settings=settings,
                standalone=True,
                clusterwide=clusterwide,
                namespaces=() if clusterwide else list(namespaces),
                stop_flag=stop_flag,
                memo=memo,
            )
            # kopf took over SIGINT/SIGTERM for itself; give Ctrl+C back to pytest (tests stop it by the flag).
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await kopf.run_tasks(tasks, ignored=_Bystanders(before))

        task = asyncio.create_task(operate(), name=f"kopf operator {module.__name__}")
        task.add_done_callback(lambda _: emulator.notify())  # an operator dying at startup ends the wait below
        run = OperatorRun(module, settings, task, stop_flag)
        runs.append(run)
        await emulator.wait_for(
            lambda: task.done() or all(emulator.open_watches(resource) for resource in wait_for),
            timeout=timeout,
            message=f"the operator watches {sorted(wait_for)}",
        )
        if task.done():
            await task  # it failed to start: raise why
            raise RuntimeError(f"the operator {module.__name__} exited at startup")
        return run

    yield start
    for run in reversed(runs):
        await run.stop()


@pytest_asyncio.fixture
async def webhook(
    emulator: Emulator, run_operator: RunOperator, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Webhook]:
    """The operator (dgx_operator.runtime.handlers and its validating webhook, a registry of their own) with a
    plain-HTTP webhook server on a free loopback port, once that server listens (an event, not a poll:
    kopf's server yields its client config right after its socket listens)."""
    port = free_port()
    listening: asyncio.Future[kopf.WebhookClientConfig] = asyncio.get_running_loop().create_future()

    class ObservedWebhookServer(admission.WebhookServer):
        """kopf's server, telling the test the client config it yields once its socket listens."""

        async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
            async for client_config in super().__call__(fn):
                if not listening.done():
                    listening.set_result(client_config)
                yield client_config

    monkeypatch.setattr(admission, "WebhookServer", ObservedWebhookServer)  # admission.setup builds it at startup
    # The review's budgets (4 s of mount lookups, 3 s of dry-runs) are sized for a real apiserver's
    # timeoutSeconds; here the apiserver is the in-memory emulator on the same two cores as the rest
    # of the suite, where a loaded run once took past 3 s to answer a dry-run and the review admitted
    # the job with a "did not answer" warning instead of checking it. The budgets themselves are
    # tested with their own values (tests/unit/test_admission.py, test_webhook_hostile.py).
    monkeypatch.setattr(admission, "MOUNT_LOOKUP_TIMEOUT_S", 60.0)
    monkeypatch.setattr(admission, "DRY_RUN_TIMEOUT_S", 60.0)
    config = OperatorConfig(
        webhook=WebhookConfig(host="127.0.0.1", port=port, insecure=True),
        error_backoffs=(0.1, 0.2, 0.5, 1.0),
        retry_base=0.1,
    )
    operator = types.ModuleType("kubedgx_operator_with_webhook")
    operator.registry = operator_registry()  # type: ignore[attr-defined]
    run = await run_operator(operator, memo=kopf.Memo(config=config))
    # The server listens or the operator died at startup, whichever comes first.
    either: set[asyncio.Future[Any]] = {listening, run.task}
    done, _ = await asyncio.wait(either, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    if run.task in done:
        await run.task  # raise why it stopped
        raise RuntimeError("the operator exited before its webhook server listened")
    assert listening in done, f"the webhook server did not listen within {READY_TIMEOUT_S}s"
    client_config = listening.result()
    async with aiohttp.ClientSession() as http:
        yield Webhook(client_config=dict(client_config), port=port, http=http)


from tests.gcs import gcs  # noqa: E402,F401  (the session's fake-gcs-server, for the gs:// data-mount scenarios)
from tests.s3 import s3  # noqa: E402,F401  (the session's moto S3 server, for the data-mount scenarios)
