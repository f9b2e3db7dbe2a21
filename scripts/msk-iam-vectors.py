#!/usr/bin/env python3
"""Prints the MSK IAM tokens that src/net/msk_iam.rs's unit tests compare against, made by AWS's own
signer (aws-msk-iam-sasl-signer-python on botocore) for fixed credentials, regions and signing time.

    python3 -m venv /tmp/msk && /tmp/msk/bin/pip install aws-msk-iam-sasl-signer-python==1.0.2
    /tmp/msk/bin/python scripts/msk-iam-vectors.py

The signing time is pinned by replacing botocore's clock; nothing is sent anywhere.
"""
import base64
import datetime

import botocore.auth
from botocore.credentials import Credentials

SIGNED_AT = datetime.datetime(2026, 12, 5, 10, 0, 0)  # UTC, as botocore reads it
botocore.auth.get_current_datetime = lambda *args, **kwargs: SIGNED_AT

from aws_msk_iam_sasl_signer import MSKAuthTokenProvider  # noqa: E402 (after the clock is pinned)

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
CASES = [
    ("long-term, us-east-1", Credentials("AKIDEXAMPLE", SECRET), "us-east-1"),
    (
        "temporary, eu-west-2",
        Credentials("ASIAEXAMPLE", SECRET, "FwoGZXIvYXdzEXAMPLE//token+with/special=chars"),
        "eu-west-2",
    ),
]

# The module keeps its token builder private; the public functions differ only in where credentials
# come from.
build = MSKAuthTokenProvider.__dict__["__construct_auth_token"]
for name, credentials, region in CASES:
    token, expires_ms = build(region, credentials)
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    print(f"# {name}\n# {url}\n# expires at {expires_ms} ms\n{token}\n")
