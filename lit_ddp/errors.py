"""Errors that are the user's to fix: the CLI prints them as one line, without a traceback."""


class UserError(Exception):
    """Bad input (missing data, wrong config, impossible device count).

    The message must name the problem and the fix in one sentence, e.g.
    ``CIFAR-10 not found in data/cifar-10-batches-py: pass --data.download=true ...``.
    """
