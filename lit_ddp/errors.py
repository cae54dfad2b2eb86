"""Errors that are the user's to fix: the CLI prints them as one line, without a traceback. Besides lit_ddp's
own, a library class named in the config that refuses the user's set-up while it is created is one line too
(``constructor_failure``)."""


class UserError(Exception):
    """Bad input (missing data, wrong config, impossible device count).

    The message must name the problem and the fix in one sentence, e.g.
    ``CIFAR-10 not found in data/cifar-10-batches-py: pass --data.download=true ...``.
    """


# Packages whose classes a config names and whose constructors raise for the user's set-up, not a bug of
# theirs: the missing package, the tracking store that needs an opt-in. A class of the user's own keeps
# its traceback, which shows where in their code it failed.
LIBRARIES = ("lightning", "pytorch_lightning", "lit_ddp", "torch", "torchvision", "torchmetrics")
# The modules that call the constructors of the classes a config names.
INSTANTIATORS = ("jsonargparse", "lightning.pytorch.cli")


def exception_chain(err: BaseException | None) -> list[BaseException]:
    """``err``, then what caused it (``__cause__``, else ``__context__``), down to the first exception."""
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def constructor_failure(err: BaseException) -> str | None:
    """One line for an exception that a library class named in the config (a logger, a callback, a plugin)
    raised while jsonargparse created it: the class, the exception's type and its own message. None for
    anything else, and for a class of the user's own (its traceback shows where it failed)."""
    chain = exception_chain(err)
    root = chain[-1]
    cls = _constructed_class(root)
    if len(chain) < 2 or cls is None:
        return None
    library = cls.__module__.split(".")[0] in LIBRARIES
    if not (library or isinstance(root, ImportError)):
        return None
    message = " ".join(str(root).split()) or "(no message)"
    return f"{cls.__name__} could not be created: {type(root).__name__}: {message}"


def constructor_error(err: BaseException) -> BaseException | None:
    """The exception that a constructor the config's instantiation called raised, beneath the instantiator's
    own wrapping of it (jsonargparse's "Does not validate against any of the Union subtypes"): the first of
    the chain that the instantiators did not raise themselves. None where they raised every one."""
    return next((e for e in exception_chain(err) if not _raised_by(e, INSTANTIATORS)), None)


def _raised_by(err: BaseException, modules: tuple[str, ...]) -> bool:
    """Whether the innermost frame of ``err``'s traceback, where it was raised, is in one of ``modules``."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith(modules)


def _constructed_class(err: BaseException) -> type | None:
    """The class whose ``__init__`` the config's instantiation called when ``err`` was raised: the innermost
    constructor that jsonargparse or LightningCLI called, so that a network the config gives the model is
    its own class, not the model; a class that one builds in turn (a logger's tracking store) is its part."""
    found, caller, tb = None, "", err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            if not module.startswith("jsonargparse") and (found is None or caller.startswith(INSTANTIATORS)):
                found = type(frame.f_locals["self"])
        caller, tb = module, tb.tb_next
    return found
