#!/usr/bin/env python3
"""Writes tests/fixtures/aws-signers/tokens.json: tokens made by AWS's own signers for fixed
credentials, regions, hosts and clocks, which src/cloud/aws/sign.rs's tests compare the relay's
tokens with, byte for byte (without Python).

MSK tokens come from aws-msk-iam-sasl-signer-python, RDS tokens from botocore's
generate_db_auth_token. Run it with a Python that has both (versions pinned below), e.g.

    python3 -m venv /tmp/venv-aws
    /tmp/venv-aws/bin/pip install aws-msk-iam-sasl-signer-python==1.0.2 boto3==1.44.8
    /tmp/venv-aws/bin/python scripts/aws-signer-fixtures/generate.py

The signers read the clock through botocore.auth.get_current_datetime, which is replaced by
each case's fixed instant; no credential file, environment credential or network is used.
"""

import datetime
import importlib.metadata
import json
import os
import pathlib
import sys
from unittest import mock

# Hermetic: no profile or environment credentials reach the signers.
for name in list(os.environ):
    if name.startswith("AWS_"):
        del os.environ[name]
os.environ["AWS_CONFIG_FILE"] = os.devnull
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

import botocore.auth  # noqa: E402
import botocore.session  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402
from aws_msk_iam_sasl_signer import MSKAuthTokenProvider  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/aws-signers/tokens.json"

# AWS's documentation example keys; the session tokens hold '+', '/' and '=' on purpose.
ACCESS_KEY = "AKIDEXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SESSION_TOKENS = [
    None,
    "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQD+session/token==",
]

MSK_CASES = [
    ("us-east-1", "2026-03-01T12:34:56Z"),
    ("eu-west-1", "2025-12-31T23:59:59Z"),
    ("ap-southeast-2", "2027-07-04T00:00:00Z"),
]

RDS_CASES = [
    ("us-east-1", "mydb.abcdefghijkl.us-east-1.rds.amazonaws.com", 5432, "outbox_relay",
     "2026-03-01T12:34:56Z"),
    ("eu-central-1", "orders.cluster-abcdefghijkl.eu-central-1.rds.amazonaws.com", 6543,
     "relay@svc", "2025-12-31T23:59:59Z"),
    ("us-west-2", "10.1.2.3", 5432, "Relay User", "2027-07-04T00:00:00Z"),
]


def instant(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")


def unix(text):
    return int(instant(text).replace(tzinfo=datetime.timezone.utc).timestamp())


def at(text):
    # botocore.auth imported get_current_datetime by name; replace it there.
    return mock.patch.object(botocore.auth, "get_current_datetime", lambda: instant(text))


def credentials(token):
    return Credentials(ACCESS_KEY, SECRET_KEY, token)


def msk(region, time, token):
    with at(time):
        construct = getattr(MSKAuthTokenProvider, "__construct_auth_token")
        value, expiry_ms = construct(region, credentials(token))
    return {
        "kind": "msk",
        "region": region,
        "time": unix(time),
        "session_token": token,
        "user_agent": f"aws-msk-iam-sasl-signer-python/{version('aws-msk-iam-sasl-signer-python')}",
        "token": value,
        "expiry_ms": expiry_ms,
    }


def rds(region, host, port, user, time, token):
    client = botocore.session.Session().create_client(
        "rds",
        region_name=region,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        aws_session_token=token,
    )
    with at(time):
        value = client.generate_db_auth_token(host, port, user)
    return {
        "kind": "rds",
        "region": region,
        "time": unix(time),
        "session_token": token,
        "host": host,
        "port": port,
        "user": user,
        "token": value,
    }


def version(package):
    return importlib.metadata.version(package)


def main():
    cases = []
    for token in SESSION_TOKENS:
        cases += [msk(region, time, token) for region, time in MSK_CASES]
        cases += [rds(*case, token) for case in RDS_CASES]
    document = {
        "generated_by": "scripts/aws-signer-fixtures/generate.py",
        "signers": {
            "aws-msk-iam-sasl-signer-python": version("aws-msk-iam-sasl-signer-python"),
            "botocore": version("botocore"),
        },
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "cases": cases,
    }
    OUT.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {len(cases)} tokens to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
