"""The client module: its defaults are those of the zero-config run, from Python and the CLI."""

from fl_lightning import ClientModule, FederatedModule
from fl_lightning.models import SmallCNN


def test_client_defaults_are_the_federated_module_defaults():
    client, default = ClientModule(), FederatedModule().client
    for c in (client, default):
        assert (c.lr, c.momentum, c.weight_decay, c.optimizer_name) == (0.1, 0.9, 0.0, "sgd")
        assert isinstance(c.net, SmallCNN) and c.net.features[0].in_channels == 1
    assert client.net is not default.net and client.net is not ClientModule().net  # no shared default


def test_none_net_is_still_the_default_network():
    assert isinstance(ClientModule(net=None).net, SmallCNN)
