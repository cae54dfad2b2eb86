"""Each phrase of jsonargparse's messages that lit_ddp/cli_errors.py reads is still what the installed
version emits (jsonargparse 4.53; argparse of Python 3.11 for the subcommand choice).

jsonargparse raises ArgumentError with a message and no fields, so cli_errors reads phrases; one test per
phrase makes the installed library say it (through the real CLI) and checks the phrase's pattern finds it.
A reworded message fails here, naming the phrase, instead of giving users jsonargparse's raw text.
"""

import argparse
import re
from pathlib import Path

import jsonargparse
import pytest

import lit_ddp.cli as cli
from lit_ddp.cli_errors import JSONARGPARSE_PHRASES

# Phrase → the command line that makes jsonargparse say it ({tmp}: a folder for config files).
TRIGGERS = {
    "config": ["fit", "--config", "{tmp}/broken.yaml"],
    "missing_file": ["fit", "--config", "{tmp}/absent.yaml"],
    "not_a_file": ["fit", "--config", "{tmp}"],
    "parser_key": ["fit", "--trainer.max_epochs=abc"],
    "class_path": ["fit", "--model.lrr=3"],
    "class_option": ["fit", "--model.lrr=3"],
    "unrecognized": ["fit", "--trainer.max_epoch=3"],
    "value": ["fit", "--trainer.max_epochs=abc"],
    "import_path": ["fit", "--model=LeNetCifar"],
    "literal": ["fit", "--model.optim.name=adamx"],
    "type": ["fit", "--trainer.max_epochs=abc"],
    "group": ["fit", "--model.optim=adam"],
    "subtypes": ["fit", "--checkpoint=lit_ddp.callbacks.EMA"],
    "required": ["--model=ImageClassifier"],
}
# Phrases that the CLI's own paths do not reach on this version: (module, its source's text, a message).
IN_SOURCE = {
    "command": (argparse, "invalid choice: %(value)r", "invalid choice: 'fitt' (choose from fit, test)"),
    "not_accepted": (
        jsonargparse,
        "does not accept option '{subkey}'",
        "Subcommand 'fit' does not accept option 'x'",
    ),
}


def test_every_phrase_has_a_check() -> None:
    assert set(TRIGGERS) | set(IN_SOURCE) == set(JSONARGPARSE_PHRASES)


@pytest.mark.parametrize("phrase", sorted(TRIGGERS))
def test_jsonargparse_still_says_each_phrase(phrase: str, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "broken.yaml").write_text("trainer:\n  max_epochs: [1,\n")
    said: list[str] = []
    monkeypatch.setattr(cli, "explain", lambda message, *args: said.append(message) or "explained")
    with pytest.raises(cli.UserError, match="explained"):
        cli.build_cli([a.format(tmp=tmp_path) for a in TRIGGERS[phrase]], run=False)
    assert re.search(JSONARGPARSE_PHRASES[phrase], said[0]), f"{phrase}: jsonargparse now says {said[0]!r}"


@pytest.mark.parametrize("phrase", sorted(IN_SOURCE))
def test_the_library_still_holds_each_phrase_the_cli_does_not_reach(phrase: str) -> None:
    package, text, example = IN_SOURCE[phrase]
    where = Path(package.__file__)
    files = [where] if where.name != "__init__.py" else list(where.parent.glob("*.py"))
    assert any(text in p.read_text() for p in files), f"{package.__name__} no longer says {text!r}"
    assert re.search(JSONARGPARSE_PHRASES[phrase], example)
