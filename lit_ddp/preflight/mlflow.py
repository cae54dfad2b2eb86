"""An MLflow tracking store that cannot be used: one line before the run, within seconds (the preflight's
``mlflow_store`` row).

MLFlowLogger resolves its store when the config creates it, and first reaches it at the run's first log: a
URI of a scheme MLflow has no store for stopped the config's instantiation with MLflow's exception under
jsonargparse's, and a server that does not answer was retried with backoff for minutes before the run
stopped with tracebacks. Here the store is asked once, before the logger is created and before any process
starts, with MLflow's HTTP retries off and a short timeout for that one request (MLflow reads both from
the environment at each request; they are restored after it). The run's own requests keep MLflow's
retries: a server that answered at the start and then hiccups is retried as usual.
"""

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from lit_ddp.errors import exception_chain
from lit_ddp.writes import ADVICE, advice

# One try, and no longer than this for an answer, for the start-up request only.
PROBE_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
OPTION = "--trainer.logger.init_args.tracking_uri"


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def mlflow_stores(loggers: list[tuple[type | None, object]]) -> tuple[tuple[str, str, str | None], ...]:
    """(tracking URI, experiment, run id given or None) of each MLFlowLogger (or subclass) among ``loggers``
    (``folders.logger_configs``), by MLFlowLogger's own rule: its ``tracking_uri``, or its ``save_dir`` as a
    local file store."""
    from lightning.pytorch.loggers import MLFlowLogger

    return tuple(
        (
            init_args.get("tracking_uri") or f"file:{init_args.get('save_dir') or './mlruns'}",
            init_args.get("experiment_name") or "lightning_logs",
            str(run_id) if (run_id := init_args.get("run_id")) else None,
        )
        for cls, init_args in loggers
        if cls is not None and issubclass(cls, MLFlowLogger)
    )


def _problem(err: BaseException, uri: str) -> str | None:
    """The line for what the probe of ``uri`` raised, decided by the exceptions' types; None: not ours."""
    import requests
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    for e in exception_chain(err):
        if isinstance(e, UnsupportedModelRegistryStoreURIException):
            schemes = ", ".join(f"{s}:" for s in e.supported_uri_schemes if s)
            return (
                f"{OPTION}={uri}: MLflow has no tracking store for that scheme: pass a folder, or a URI of"
                f" one of {schemes}"
            )
        if isinstance(e, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
            return (
                f"the MLflow tracking server {uri} does not answer ({type(e).__name__}): start it, or pass"
                f" {OPTION}=<its address> (or a folder, for a local store)"
            )
        if isinstance(e, OSError) and e.errno in ADVICE:
            where = e.filename or uri
            return f"could not write the MLflow store {where} ({e.strerror}): {advice(e, OPTION)}"
    return None


def _run_stage(client, run_id: str) -> tuple[str, str | None]:
    """The lifecycle stage of the run ``run_id`` in ``client``'s store and the id of its experiment;
    ("missing", None) where the store has no such run."""
    from mlflow.exceptions import MlflowException

    try:
        info = client.get_run(run_id).info
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return "missing", None
    return info.lifecycle_stage, str(info.experiment_id)


@dataclass(frozen=True)
class StoreAnswer:
    """What one request to an MLflow store told: the line for a store or run that cannot be used (None where
    it answers), and the id of the experiment that holds the run given, else of the experiment named (None
    where there is none, or the store cannot be asked)."""

    problem: str | None = None
    experiment_id: str | None = None


def ask_store(uri: str, experiment: str, run_id: str | None = None) -> StoreAnswer:
    """The store at ``uri`` asked once: for the run ``run_id`` (the one the logger is given; its experiment is
    its own), else for the experiment named (read, nothing created)."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        return StoreAnswer()  # the logger's creation names the missing package (errors.constructor_failure)
    try:
        with _environment(PROBE_ENV):
            client = MlflowClient(uri)
            if run_id is not None:
                stage, holder = _run_stage(client, run_id)
                return StoreAnswer(_run_problem(uri, run_id, stage), holder)
            found = client.get_experiment_by_name(experiment)
    except Exception as err:  # noqa: BLE001 (told apart by type in _problem; the rest is the logger's)
        # Another refusal (a file store MLflow 3 asks an opt-in for): the logger's own creation reports it,
        # as one line naming the logger (errors.constructor_failure).
        return StoreAnswer(_problem(err, uri))
    if found is None:
        return StoreAnswer()
    if found.lifecycle_stage == "deleted":
        # MLFlowLogger would create it again, which the store refuses while the deleted one keeps its name.
        return StoreAnswer(
            f"the MLflow experiment '{experiment}' in {uri} was deleted: restore it"
            f" (MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id {found.experiment_id}),"
            " or pass --trainer.logger.init_args.experiment_name=<another name>",
            str(found.experiment_id),
        )
    return StoreAnswer(experiment_id=str(found.experiment_id))


class StoreAnswers:
    """One preflight's answers of the MLflow stores, each store asked once whoever asks (the runs that
    ``last`` searches, the ``mlflow_store`` row): made for each plan, so a later run's preflight asks anew."""

    def __init__(self) -> None:
        self._answers: dict[tuple[str, str, str | None], StoreAnswer] = {}

    def __call__(self, uri: str, experiment: str, run_id: str | None = None) -> StoreAnswer:
        key = (uri, experiment, run_id)
        if key not in self._answers:
            self._answers[key] = ask_store(*key)
        return self._answers[key]


def store_problem(uri: str, experiment: str, run_id: str | None = None) -> str | None:
    """The line for an MLflow store at ``uri`` that cannot be used, or that has no run ``run_id`` (the one
    the logger is given), asked once; None where it answers."""
    return ask_store(uri, experiment, run_id).problem


def _run_problem(uri: str, run_id: str, stage: str) -> str | None:
    """The line for a run the logger is given that the store at ``uri`` has not (MLFlowLogger's creation
    stopped with MLflow's traceback), or has deleted (its first log did); None for a run it can log into."""
    option = "--trainer.logger.init_args.run_id"
    if stage == "missing":
        return (
            f"{option}={run_id}: the MLflow store {uri} has no such run: pass the id of one of its runs, or"
            f" none ({option}=null: a new run)"
        )
    if stage == "deleted":
        return (
            f"{option}={run_id}: the MLflow run was deleted from {uri}: restore it"
            f" (MLFLOW_TRACKING_URI={uri} mlflow runs restore --run-id {run_id}), or pass {option}=null"
            " (a new run)"
        )
    return None
