"""Test credentials for a secure local Flower federation: a CA, the SuperLink's certificate, node keys.

``python -m fl_lightning.flower keys --out keys --nodes 4`` writes, with the ``cryptography`` package
(Flower's own dependency):

- ``ca.pem``: a self-signed test certificate authority (its private key is not kept: it signs the
  SuperLink's certificate once, then is dropped). Every SuperNode (``--root-certificates``) and every
  ``flwr`` user (``root-certificates`` in Flower's ``config.toml``) trusts it.
- ``superlink.pem`` / ``superlink.key``: the SuperLink's TLS certificate, signed by the CA, for the names
  it is reached by (``127.0.0.1`` and ``localhost``, plus ``--host`` ones), and its private key
  (``flower-superlink --ssl-ca-certfile ca.pem --ssl-certfile superlink.pem --ssl-keyfile superlink.key``).
- ``node-<i>.key`` / ``node-<i>.pub``: one elliptic-curve (NIST P-384) key pair per SuperNode, in
  OpenSSH format, as Flower's node authentication takes them: the private key stays on its node
  (``flower-supernode --auth-supernode-private-key node-<i>.key``); the public key is registered with
  the SuperLink (``flwr supernode register node-<i>.pub <federation>``), which then accepts only nodes
  holding a registered key (``flower-superlink --enable-supernode-auth``).

For testing only: every key is made on one machine, unencrypted, and the CA is ours. In production, the
SuperLink's certificate comes from the organisation's CA (or a public one) for its real host name, each
site makes its node key pair itself and sends only its public key to the federation's operator to
register (NVFlare's provisioning gives every site such a signed startup kit), and private keys never
leave their machine.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fl_lightning.errors import ConfigError

#: The names a local SuperLink is reached by; ``--host`` adds more.
LOCAL_HOSTS = ("127.0.0.1", "localhost")
CA, CERT, KEY = "ca.pem", "superlink.pem", "superlink.key"


@dataclass(frozen=True)
class Keys:
    """The files :func:`make_keys` wrote."""

    ca: Path
    cert: Path
    key: Path
    node_keys: tuple[Path, ...]
    node_pubs: tuple[Path, ...]


def node_key_names(i: int) -> tuple[str, str]:
    """The private and public key file names of node ``i``."""
    return f"node-{i}.key", f"node-{i}.pub"


def _write(path: Path, data: bytes, private: bool) -> None:
    """Write ``data`` to ``path``; a private key is readable by its owner only (0600) from the start."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    if private:
        os.chmod(path, 0o600)


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_keys(
    out: str | Path, nodes: int, hosts: Sequence[str] = (), days: int = 365, force: bool = False
) -> Keys:
    """Write a test CA, the SuperLink's certificate for ``127.0.0.1``, ``localhost`` and ``hosts``, and
    ``nodes`` node key pairs into ``out`` (see the module's docstring).

    Raises:
        ConfigError: One line: ``nodes`` < 1, ``days`` < 1, a host that is empty, or files that exist
            already in ``out`` (unless ``force``).
    """
    if isinstance(nodes, bool) or nodes < 1:
        raise ConfigError(f"keys: --nodes={nodes} must be >= 1 (one key pair per SuperNode)")
    if days < 1:
        raise ConfigError(f"keys: --days={days} must be >= 1")
    if any(not h.strip() for h in hosts):
        raise ConfigError("keys: --host must not be empty; give the SuperLink's host name or IP address")
    folder = Path(out).expanduser()
    names = [CA, CERT, KEY, *(n for i in range(nodes) for n in node_key_names(i))]
    existing = [n for n in names if (folder / n).exists()]
    if existing and not force:
        raise ConfigError(
            f"keys: {folder / existing[0]} exists; choose an empty --out folder, or pass --force to replace "
            "the keys (nodes registered with the old ones must then be registered again)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)  # a little slack for clock skew
    until = now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, "fl_lightning test CA (not for production)")]
    )
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    server_key = ec.generate_private_key(ec.SECP384R1())
    all_hosts = [*LOCAL_HOSTS, *(h.strip() for h in hosts)]
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, all_hosts[-1])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(_san(all_hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    pem = serialization.Encoding.PEM
    _write(folder / CA, ca_cert.public_bytes(pem), private=False)
    _write(folder / CERT, server_cert.public_bytes(pem), private=False)
    _write(
        folder / KEY,
        server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        private=True,
    )
    keys, pubs = [], []
    for i in range(nodes):
        node = ec.generate_private_key(ec.SECP384R1())
        private_name, public_name = node_key_names(i)
        _write(
            folder / private_name,
            node.private_bytes(pem, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
            private=True,
        )
        public = node.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        _write(folder / public_name, public + b"\n", private=False)
        keys.append(folder / private_name)
        pubs.append(folder / public_name)
    return Keys(folder / CA, folder / CERT, folder / KEY, tuple(keys), tuple(pubs))


__all__ = ["CA", "CERT", "KEY", "LOCAL_HOSTS", "Keys", "make_keys", "node_key_names"]
