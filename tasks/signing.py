"""Celery message signing (the `auth` serializer, with the cryptography package), an option for
fleets where a broker password alone is not trust enough (boards hold it, for instance).

With EDGETRAIN_SIGNING_KEY, EDGETRAIN_SIGNING_CERTIFICATE and EDGETRAIN_SIGNING_CERT_STORE set,
a process signs every task and remote-control message it sends with its key, and its worker
accepts only messages signed by a certificate in its store: an unsigned or forged task is
refused before it is decoded. Results and monitoring events stay plain JSON."""

from __future__ import annotations

from typing import Any

from celery import Celery

from edgetrain.common.settings import Settings

DIGEST = "sha256"


def signing_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings that sign and verify messages; empty when signing is off."""
    if not settings.signing:
        return {}
    return {
        "task_serializer": "auth",
        "accept_content": ["auth"],
        "result_accept_content": ["json"],
        "security_key": str(settings.signing_key),
        "security_certificate": str(settings.signing_certificate),
        "security_cert_store": str(settings.signing_cert_store),
        "security_digest": DIGEST,
    }


def enable_signing(app: Celery, settings: Settings) -> None:
    """Register the signing serializer with `app`'s key and certificates (process-wide: every
    serializer but JSON is disabled too); nothing when signing is off."""
    if settings.signing:
        app.setup_security(allowed_serializers=["json"], serializer="json", digest=DIGEST)
