"""fl_lightning.config.resolve: what a ``fit`` command line resolves to, read as fit's config.yaml reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fl_lightning.config import resolver
from fl_lightning.config.parser import upgraded_content
from fl_lightning.config.resolve import _ParseOnly, dump_as_loaded
from fl_lightning.config.run import parse_errors
from fl_lightning.lightning.console import console

ROOT = Path(__file__).resolve().parents[2]


FD = ROOT / "configs" / "filter_decomposition"


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (
            [f"--config={ROOT / 'configs' / 'fedavg_digits.yaml'}", "--name=1e-3", "--trainer.max_steps=3"],
            "1e-3",
        ),
        (
            [
                f"--config={FD / 'global_cifar10_100_2_cpu.yaml'}",
                f"--config={FD / 'dense' / 'lenet_digits.yaml'}",
                f"--config={FD / 'strategies' / 'scaffold_cpu.yaml'}",
                "--name=yes",
            ],
            "yes",
        ),
        (
            [
                "--model.strategy=FedProx",
                "--model.strategy.mu=0.5",
                "--data.dataset=Shakespeare",
                "--name=null",
            ],
            None,
        ),
    ],
)
def test_the_resolved_config_is_fits_config_yaml_read_back(args, name):
    """The fast dump (no second validation, libyaml) gives exactly ``yaml.safe_load`` of fit's dump."""
    with console(), parse_errors():
        parser = _ParseOnly(args=[], run=False).parser
        config = parser.parse_args(args)
        slow = yaml.safe_load(parser.dump(config, skip_unset=False))
        fast = dump_as_loaded(parser, config)
    assert fast == slow
    assert list(fast) == list(slow)  # the keys in the same order (a digest of the text would see it)
    assert fast["name"] == name  # a text that YAML would read as a number or a bool stays a text
    assert resolver()(args, False) == slow


def test_an_edited_config_file_is_read_again(tmp_path, monkeypatch):
    """A config file's text is kept by text: editing it between two resolutions is seen, in the current
    spelling and in a former one (upgraded)."""
    monkeypatch.chdir(tmp_path)
    resolve = resolver()
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  max_steps: 3\n")
    assert resolve(["--config=c.yaml"], False)["trainer"]["max_steps"] == 3
    path.write_text("trainer:\n  max_steps: 5\n")
    assert resolve(["--config=c.yaml"], False)["trainer"]["max_steps"] == 5
    former = "data:\n  dataset: fedprox_synthetic\n  fedprox_synthetic:\n    alpha: {}\n"
    path.write_text(former.format(0.5))
    first = resolve(["--config=c.yaml"], False)["data"]["dataset"]
    path.write_text(former.format(0.25))
    second = resolve(["--config=c.yaml"], False)["data"]["dataset"]
    assert first["class_path"] == second["class_path"] == "fl_lightning.data.FedProxSynthetic"
    assert (first["init_args"]["alpha"], second["init_args"]["alpha"]) == (0.5, 0.25)


def test_upgraded_content_is_the_text_unless_a_former_spelling_is_upgraded():
    current = "trainer:\n  max_steps: 3\n"
    assert upgraded_content(current) == current
    assert upgraded_content("a: [1\n") == "a: [1\n"  # not YAML: jsonargparse reports it
    former = "data:\n  dataset: fedprox_synthetic\n  fedprox_synthetic:\n    alpha: 0.5\n"
    upgraded = yaml.safe_load(upgraded_content(former))
    assert upgraded["data"]["dataset"]["class_path"].endswith("FedProxSynthetic")
    assert upgraded_content(former) is upgraded_content(former)  # kept: read once per text


def test_one_resolver_gives_each_command_line_what_a_new_parser_gives():
    """The resolver keeps its parser's defaults (computed once): a command line that changes a class, its
    arguments or a callback list does not leak into the next one's resolution."""
    lines = [
        ["--model.strategy=FedProx", "--model.strategy.mu=0.5", "--data.partition=Pathological"],
        ["--trainer.max_steps=3", "--data.num_clients=6"],
        ["--model.strategy=Scaffold", "--data.dataset=Shakespeare", "--data.dataset.max_windows=50"],
        [],
    ]
    resolve = resolver()
    with console(), parse_errors():
        parser = _ParseOnly(args=[], run=False).parser
        assert parser._get_default_config_files() == [] and not parser.default_env  # nothing else read
        fresh = [dump_as_loaded(parser, parser.parse_args(args)) for args in lines]
    assert [resolve(args, False) for args in lines] == fresh
    assert resolve([], False)["model"]["strategy"]["class_path"] == "fl_lightning.strategies.FedAvg"
