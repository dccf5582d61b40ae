"""The test credentials of a secure local federation (``python -m fl_lightning.flower keys``): a CA, the
SuperLink's certificate signed by it for its host names, node key pairs in the form Flower's node
authentication takes; private keys readable by their owner only; bad input one line."""

from __future__ import annotations

import ipaddress
import stat

import pytest

pytest.importorskip("flwr")

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fl_lightning.errors import ConfigError
from fl_lightning.flower.__main__ import main
from fl_lightning.flower.keys import make_keys


def test_the_superlink_certificate_is_signed_by_the_ca_for_its_hosts(tmp_path):
    made = make_keys(tmp_path, 2, hosts=["server.example", "10.0.0.7"])
    ca = x509.load_pem_x509_certificate(made.ca.read_bytes())
    cert = x509.load_pem_x509_certificate(made.cert.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises unless the CA signed it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "server.example"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.0.0.7"),
    }
    key = serialization.load_pem_private_key(made.key.read_bytes(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()


def test_node_key_pairs_are_openssh_p384_and_private_files_are_the_owners(tmp_path):
    made = make_keys(tmp_path, 3)
    assert [p.name for p in made.node_keys] == ["node-0.key", "node-1.key", "node-2.key"]
    for private, public in zip(made.node_keys, made.node_pubs, strict=True):
        key = serialization.load_ssh_private_key(private.read_bytes(), None)
        pub = serialization.load_ssh_public_key(public.read_bytes())
        assert isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP384R1)
        assert public.read_text().startswith("ecdsa-sha2-nistp384 ")
        assert key.public_key().public_numbers() == pub.public_numbers()
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600
    assert len({p.read_text() for p in made.node_pubs}) == 3  # one key pair per node


def test_existing_keys_are_kept_unless_forced(tmp_path):
    first = make_keys(tmp_path, 1).node_pubs[0].read_text()
    with pytest.raises(ConfigError, match="node-0.key exists|ca.pem exists") as err:
        make_keys(tmp_path, 1)
    assert "--force" in str(err.value) and "\n" not in str(err.value)
    assert make_keys(tmp_path, 1, force=True).node_pubs[0].read_text() != first


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--nodes", "0"], "--nodes=0 must be >= 1"),
        (["--nodes", "1", "--days", "0"], "--days=0 must be >= 1"),
        (["--nodes", "1", "--host", " "], "--host must not be empty"),
    ],
)
def test_bad_keys_arguments_are_one_error_line(tmp_path, capsys, argv, expected):
    with pytest.raises(SystemExit) as code:
        main(["keys", "--out", str(tmp_path / "k"), *argv])
    assert code.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: keys: ") and expected in err


def test_the_keys_command_says_what_each_file_is_for(tmp_path, capsys):
    main(["keys", "--out", str(tmp_path), "--nodes", "2"])
    out = capsys.readouterr().out
    assert "for testing" in out and "--root-certificates" in out and "flwr supernode register" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ca.pem",
        "node-0.key",
        "node-0.pub",
        "node-1.key",
        "node-1.pub",
        "superlink.key",
        "superlink.pem",
    ]
