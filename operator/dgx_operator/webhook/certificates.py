"""The self-signed webhook's certificate, kept in a Secret that every replica shares, and its CA
injected into the chart's ValidatingWebhookConfiguration: the way Kueue's and JobSet's internal
certificate managers (open-policy-agent's cert-controller) do it.

Why a Secret: a CA made at every start, as before, changed the caBundle on every restart, so every
request between the new replica's start and the apiserver seeing the new bundle failed TLS, and two
replicas would overwrite each other's bundle. With one pair in a Secret:

* the first replica to find the Secret empty (or its pair unusable: expiring within
  :data:`RENEW_BEFORE`, for other names, or broken) makes a pair and writes it, guarded by the
  Secret's resourceVersion; a replica that loses that race reads the winner's pair;
* every replica serves that pair and re-reads the Secret every :data:`REFRESH_S`, so a pair another
  replica renewed is served within that time (kopf's server restarts when its files change);
* a renewed pair's ``ca.crt`` carries the new CA followed by the previous one while that is valid,
  so the apiserver trusts replicas that still serve the old certificate until they reload;
* every replica makes sure the configuration's ``caBundle`` is the Secret's ``ca.crt`` (patching
  only ``caBundle`` of its own webhooks: the chart owns everything else), at start and on every
  refresh, so a configuration re-applied without it (a ``helm upgrade --force``, a GitOps sync)
  heals within :data:`REFRESH_S`.

The chart renders the Secret (empty) and the configuration, so the operator needs no ``create`` on
either; run without the chart, it creates both when they are missing (and says so when RBAC
refuses).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dgx_operator.kube import ApiError, Kube, TransientError

log = logging.getLogger("kubedgx")

#: A new pair is valid this long; it is replaced RENEW_BEFORE its end.
CERTIFICATE_DAYS = 3650
RENEW_BEFORE = timedelta(days=30)
#: How often every replica re-reads the Secret and checks the configuration's caBundle.
REFRESH_S = 30.0
#: The Secret's keys (those of a kubernetes.io/tls Secret, plus cert-manager's ca.crt).
CA_KEY, CERT_KEY, KEY_KEY = "ca.crt", "tls.crt", "tls.key"
#: Attempts at the read-modify-write of the Secret before giving up for this round.
WRITE_ATTEMPTS = 5


@dataclass(frozen=True)
class SelfSigned:
    """PEM: the CA bundle that verifies the serving certificate (the caBundle), the certificate and
    its key."""

    ca: bytes
    certificate: bytes
    key: bytes

    def data(self) -> dict[str, bytes]:
        return {CA_KEY: self.ca, CERT_KEY: self.certificate, KEY_KEY: self.key}

    @classmethod
    def of(cls, data: Mapping[str, bytes]) -> SelfSigned | None:
        if not all(data.get(k) for k in (CA_KEY, CERT_KEY, KEY_KEY)):
            return None
        return cls(ca=data[CA_KEY], certificate=data[CERT_KEY], key=data[KEY_KEY])


def self_signed(
    dns_names: Sequence[str], now: datetime | None = None, *, days: int = CERTIFICATE_DAYS, previous_ca: bytes = b""
) -> SelfSigned:
    """A new CA (whose key is dropped once it signed) and a serving certificate for ``dns_names``.
    ``previous_ca`` (PEM, possibly several) is appended to the new CA where still valid, so that a
    renewal does not break replicas still serving the previous certificate."""
    now = now or datetime.now(UTC)
    start, end = now - timedelta(minutes=5), now + timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubedgx webhook CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    kept = b"".join(c.public_bytes(pem) for c in _certificates(previous_ca) if c.not_valid_after_utc > now)
    return SelfSigned(
        ca=ca.public_bytes(pem) + kept,
        certificate=certificate.public_bytes(pem),
        key=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem) if pem.strip() else []
    except ValueError:
        return []


def unusable(pair: SelfSigned | None, dns_names: Sequence[str], now: datetime | None = None) -> str | None:
    """Why a stored pair cannot be served (None: it can): missing, unparsable, not signed by a CA of
    the bundle, a key that does not match, names it does not cover, or expiring soon."""
    if pair is None:
        return "the Secret holds no certificate yet"
    now = now or datetime.now(UTC)
    try:
        certificate = x509.load_pem_x509_certificate(pair.certificate)
        key = serialization.load_pem_private_key(pair.key, password=None)
    except ValueError as exc:
        return f"it does not parse ({exc})"
    cas = _certificates(pair.ca)
    if not cas:
        return "its CA does not parse"
    if not any(_signed_by(certificate, ca) for ca in cas):
        return "its certificate is not signed by its CA"
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        return "its key does not match its certificate"
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        covered = set(names.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        covered = set()
    missing = [n for n in dns_names if n not in covered]
    if missing:
        return f"its certificate does not cover {', '.join(missing)}"
    if certificate.not_valid_after_utc - now < RENEW_BEFORE:
        return f"its certificate expires {certificate.not_valid_after_utc:%Y-%m-%d}"
    return None


def _signed_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    try:
        return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    except ValueError:
        return {}


class PublishError(Exception):
    """The configuration cannot get the CA (missing and not creatable, or RBAC refuses): the message
    says what to do."""


@dataclass
class CertificateKeeper:
    """One replica's view of the shared pair: it writes the files its TLS server reads, and keeps
    the configuration's caBundle equal to the pair's CA."""

    kube: Kube
    namespace: str
    secret: str
    dns_names: tuple[str, ...]
    configuration: str
    #: The webhook names of the configuration that point at our Service (the ones we patch).
    webhooks: tuple[str, ...]
    #: The whole configuration, for creating it when it is missing (run without the chart).
    body: Callable[[bytes], dict[str, Any]]
    directory: str
    pair: SelfSigned | None = None

    @property
    def certfile(self) -> str:
        return os.path.join(self.directory, CERT_KEY)

    @property
    def keyfile(self) -> str:
        return os.path.join(self.directory, KEY_KEY)

    async def ensure(self) -> SelfSigned:
        """The pair to serve: the Secret's if usable, else a new one this replica wrote there (or the
        one a faster replica wrote). Files are (re)written when the pair changed."""
        for _ in range(WRITE_ATTEMPTS):
            secret = await self.kube.get_secret(self.namespace, self.secret)
            stored = SelfSigned.of(_secret_data(secret)) if secret is not None else None
            why = unusable(stored, self.dns_names)
            if why is None and stored is not None:
                self._serve(stored)
                return stored
            fresh = self_signed(self.dns_names, previous_ca=stored.ca if stored is not None else b"")
            written = await self._write(secret, fresh)
            if written:
                log.info("webhook: Secret %s/%s: a new certificate (%s)", self.namespace, self.secret, why)
                self._serve(fresh)
                return fresh
        raise TransientError(f"Secret {self.namespace}/{self.secret} kept changing while its certificate was written")

    async def _write(self, secret: Mapping[str, Any] | None, pair: SelfSigned) -> bool:
        if secret is not None:
            version = str((secret.get("metadata") or {}).get("resourceVersion") or "")
            return await self.kube.update_secret_data(self.namespace, self.secret, pair.data(), version) is not None
        try:
            return await self.kube.create_secret(self.namespace, self.secret, pair.data())
        except ApiError as exc:
            if exc.status == 403:
                raise PublishError(
                    f"Secret {self.namespace}/{self.secret} does not exist and this operator may not create it: "
                    "install the chart (it renders the Secret), or create an empty Secret of that name"
                ) from exc
            raise

    def _serve(self, pair: SelfSigned) -> None:
        """Write the pair where the TLS server reads it, atomically (the server re-reads the files
        and restarts when they change; it must never see half a pair)."""
        if self.pair == pair and os.path.exists(self.certfile):
            return
        for path, data in ((self.keyfile, pair.key), (self.certfile, pair.certificate)):
            fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(temporary, 0o600)
            os.replace(temporary, path)
        self.pair = pair

    async def inject(self, pair: SelfSigned) -> str:
        """Make the configuration's caBundle the pair's CA; what was done ("unchanged", "patched",
        "created"). Raises :class:`PublishError` when that cannot be done."""
        for _ in range(WRITE_ATTEMPTS):
            vwc = await self.kube.get_webhook_configuration(self.configuration)
            if vwc is None:
                return await self._create(pair)
            ours = [(i, h) for i, h in enumerate(vwc.get("webhooks") or []) if h.get("name") in self.webhooks]
            if not ours:
                raise PublishError(
                    f"ValidatingWebhookConfiguration {self.configuration} has none of the webhooks "
                    f"{', '.join(self.webhooks)}: re-install the chart"
                )
            wanted = base64.b64encode(pair.ca).decode("ascii")
            stale = {i: pair.ca for i, h in ours if (h.get("clientConfig") or {}).get("caBundle") != wanted}
            if not stale:
                return "unchanged"
            version = str((vwc.get("metadata") or {}).get("resourceVersion") or "")
            try:
                if await self.kube.patch_webhook_ca(self.configuration, stale, version):
                    return "patched"
            except ApiError as exc:
                if exc.status == 403:
                    raise PublishError(
                        f"RBAC refuses to patch ValidatingWebhookConfiguration {self.configuration}: the chart's "
                        "ClusterRole grants patch on exactly that name; check rbac.create and the release name"
                    ) from exc
                raise
        raise TransientError(f"ValidatingWebhookConfiguration {self.configuration} kept changing")

    async def _create(self, pair: SelfSigned) -> str:
        try:
            await self.kube.create_webhook_configuration(self.body(pair.ca))
        except ApiError as exc:
            if exc.status == 409:
                raise TransientError(f"ValidatingWebhookConfiguration {self.configuration} appeared") from exc
            if exc.status == 403:
                raise PublishError(
                    f"ValidatingWebhookConfiguration {self.configuration} does not exist and this operator may not "
                    "create it: the chart renders it (helm upgrade restores it)"
                ) from exc
            raise
        return "created"

    async def publish(self) -> None:
        """Ensure the pair and its caBundle once; failures are logged, never raised (the next refresh
        tries again, and the other replicas are doing the same)."""
        try:
            pair = await self.ensure()
            outcome = await self.inject(pair)
        except PublishError as exc:
            log.error("webhook: %s", exc)
        except (TransientError, ApiError, TimeoutError, OSError) as exc:
            log.warning("webhook: could not publish the certificate (%s); retrying in %gs", exc, REFRESH_S)
        else:
            if outcome != "unchanged":
                log.info("webhook: ValidatingWebhookConfiguration %s %s with the CA", self.configuration, outcome)

    async def keep(self, interval: float = REFRESH_S) -> None:
        """Refresh until cancelled (a deliberate period, like cert-controller's)."""
        while True:
            await asyncio.sleep(interval)
            await self.publish()
